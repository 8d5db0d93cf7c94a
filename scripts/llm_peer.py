"""The usual asyncio script for an LLM batch, written the way the OpenAI cookbook's
``api_request_parallel_processor.py`` is: the peer batchsync's "LLM batch" benchmark row is
measured against.

    python scripts/llm_peer.py requests.jsonl -o results.jsonl --rpm 600 --tpm 60000 \\
        --url http://127.0.0.1:8788/llm/key/rpm=600,tpm=60000/v1/chat/completions

INPUT is the cookbook's format: one JSON request body a line, with an optional ``metadata``
field that is kept out of the request and written back with its result. As the cookbook's
script does, it

* reads the requests one at a time and sends each once a request bucket and a token bucket
  have room for it; both buckets hold one minute's worth and refill continuously;
* estimates a request's tokens before sending it: its prompt plus ``max_tokens`` x ``n``
  (4 tokens a message, 2 a prompt; the texts at 4 characters a token where the cookbook uses
  tiktoken);
* makes up to 5 attempts of a request (every error but the last goes back to a retry queue),
  and after a rate-limit error pauses everything for 15 s;
* appends ``[request, response, metadata]`` (or the errors) to the output JSONL as each one
  finishes, in the order they finish;
* prints a JSON summary line at the end: tasks succeeded and failed, rate-limit errors, other
  errors, seconds.

Two changes, each said: ``--window`` scales "a minute" (the buckets' refill and the 15 s
pause, to 15 x window / 60 s) so that a benchmark against a mock whose minute is shortened
sees the same behaviour in less time; and the pause keys on the HTTP status 429, because the
cookbook's current code compares the error body's ``code`` with "429" and OpenAI sends
"rate_limit_exceeded" there, so as published it never pauses.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

SECONDS_TO_PAUSE_AFTER_RATE_LIMIT_ERROR = 15.0
SECONDS_TO_SLEEP_EACH_LOOP = 0.001  # 1 ms limits max throughput to 1,000 requests per second

log = logging.getLogger("llm_peer")


@dataclass
class StatusTracker:
    """The script's progress; one instance."""

    num_tasks_started: int = 0
    num_tasks_in_progress: int = 0  # the script ends when this reaches 0
    num_tasks_succeeded: int = 0
    num_tasks_failed: int = 0
    num_rate_limit_errors: int = 0
    num_api_errors: int = 0  # rate-limit errors are counted apart
    num_other_errors: int = 0
    time_of_last_rate_limit_error: float = 0.0  # to cool off after hitting rate limits


@dataclass
class APIRequest:
    """One request's inputs, errors and metadata, and the call that makes it."""

    task_id: int
    request_json: dict[str, Any]
    token_consumption: int
    attempts_left: int
    metadata: Any
    result: list[Any] = field(default_factory=list)

    async def call_api(
        self,
        *,
        session: Any,
        request_url: str,
        request_header: dict[str, str],
        retry_queue: asyncio.Queue[APIRequest],
        save_filepath: Path,
        status_tracker: StatusTracker,
    ) -> None:
        """Call the API and save the result, or put the request back for another attempt."""
        log.info("Starting request #%d", self.task_id)
        error: Any = None
        response: Any = None
        try:
            async with session.post(
                url=request_url, headers=request_header, json=self.request_json
            ) as reply:
                response = await reply.json(content_type=None)
                status = reply.status
            if isinstance(response, dict) and "error" in response:
                log.warning("Request %d failed with error %s", self.task_id, response["error"])
                error = response
                if status == 429:
                    status_tracker.time_of_last_rate_limit_error = time.time()
                    status_tracker.num_rate_limit_errors += 1
                else:
                    status_tracker.num_api_errors += 1
        except Exception as problem:  # logged and saved, as the cookbook's script does
            log.warning("Request %d failed with Exception %s", self.task_id, problem)
            status_tracker.num_other_errors += 1
            error = problem
        if error is None:
            append_to_jsonl(self.row(response), save_filepath)
            status_tracker.num_tasks_in_progress -= 1
            status_tracker.num_tasks_succeeded += 1
            return
        self.result.append(error)
        if self.attempts_left:
            retry_queue.put_nowait(self)
            return
        log.error("Request %s failed after all attempts", self.request_json)
        append_to_jsonl(self.row([str(e) for e in self.result]), save_filepath)
        status_tracker.num_tasks_in_progress -= 1
        status_tracker.num_tasks_failed += 1

    def row(self, outcome: Any) -> list[Any]:
        if self.metadata:
            return [self.request_json, outcome, self.metadata]
        return [self.request_json, outcome]


def append_to_jsonl(data: Any, filename: Path) -> None:
    with filename.open("a", encoding="utf-8") as out:
        out.write(json.dumps(data) + "\n")


def text_tokens(text: str) -> int:
    """A text's tokens at 4 characters a token (tiktoken would count them exactly)."""
    return math.ceil(len(text) / 4)


def num_tokens_consumed_from_request(request_json: dict[str, Any], endpoint: str) -> int:
    """A request's tokens: the prompt plus n x max_tokens for completions, the input for
    embeddings."""
    if endpoint.endswith("completions"):
        max_tokens = request_json.get("max_tokens", 15)
        completion_tokens = request_json.get("n", 1) * max_tokens
        if endpoint.startswith("chat/"):
            num_tokens = 2  # every reply is primed with <im_start>assistant
            for message in request_json["messages"]:
                num_tokens += 4  # <im_start>{role/name}\n{content}<im_end>\n
                for key, value in message.items():
                    num_tokens += text_tokens(str(value))
                    if key == "name":  # with a name, the role is left out
                        num_tokens -= 1
            return int(num_tokens + completion_tokens)
        prompt = request_json["prompt"]
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        return sum(text_tokens(p) for p in prompts) + int(completion_tokens) * len(prompts)
    if endpoint == "embeddings":
        given = request_json["input"]
        return sum(text_tokens(text) for text in ([given] if isinstance(given, str) else given))
    raise NotImplementedError(f'API endpoint "{endpoint}" not implemented in this script')


def api_endpoint_from_url(request_url: str) -> str:
    """The endpoint after the version: ``chat/completions`` of ``…/v1/chat/completions``."""
    _, _, endpoint = request_url.partition("/v1/")
    return endpoint.split("?", 1)[0]


def task_id_generator_function() -> Iterator[int]:
    task_id = 0
    while True:
        yield task_id
        task_id += 1


@dataclass
class Buckets:
    """The request and token buckets: one minute's worth each, refilled continuously."""

    max_requests_per_minute: float
    max_tokens_per_minute: float
    minute: float
    available_request_capacity: float = -1.0
    available_token_capacity: float = -1.0
    last_update_time: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self.available_request_capacity = self.max_requests_per_minute
        self.available_token_capacity = self.max_tokens_per_minute

    def refill(self) -> None:
        current_time = time.time()
        share = (current_time - self.last_update_time) / self.minute
        self.available_request_capacity = min(
            self.available_request_capacity + self.max_requests_per_minute * share,
            self.max_requests_per_minute,
        )
        self.available_token_capacity = min(
            self.available_token_capacity + self.max_tokens_per_minute * share,
            self.max_tokens_per_minute,
        )
        self.last_update_time = current_time

    def take(self, tokens: int) -> bool:
        """Take a request and its tokens when both buckets have them."""
        if self.available_request_capacity < 1 or self.available_token_capacity < tokens:
            return False
        self.available_request_capacity -= 1
        self.available_token_capacity -= tokens
        return True


def read_request(
    requests: Iterator[str], task_id: int, endpoint: str, max_attempts: int
) -> APIRequest | None:
    """The file's next request, its metadata set apart; None when the file is done."""
    line = next(requests, None)
    if line is None:
        return None
    request_json = json.loads(line)
    return APIRequest(
        task_id=task_id,
        request_json=request_json,
        token_consumption=num_tokens_consumed_from_request(request_json, endpoint),
        attempts_left=max_attempts,
        metadata=request_json.pop("metadata", None),
    )


async def process_api_requests_from_file(
    *,
    requests_filepath: Path,
    save_filepath: Path,
    request_url: str,
    api_key: str,
    max_requests_per_minute: float,
    max_tokens_per_minute: float,
    max_attempts: int,
    minute: float,
) -> StatusTracker:
    """Send the file's requests in parallel, throttled to stay under the rate limits."""
    seconds_to_pause_after_rate_limit_error = SECONDS_TO_PAUSE_AFTER_RATE_LIMIT_ERROR * (
        minute / 60
    )
    api_endpoint = api_endpoint_from_url(request_url)
    request_header = {"Authorization": f"Bearer {api_key}"}
    queue_of_requests_to_retry: asyncio.Queue[APIRequest] = asyncio.Queue()
    task_id_generator = task_id_generator_function()
    status_tracker = StatusTracker()
    buckets = Buckets(max_requests_per_minute, max_tokens_per_minute, minute)
    next_request: APIRequest | None = None
    tasks: set[asyncio.Task[None]] = set()
    with requests_filepath.open(encoding="utf-8") as file:
        requests = iter(file)
        async with aiohttp.ClientSession() as session:
            while True:
                # the next request (if one is not already waiting for capacity)
                if next_request is None:
                    if not queue_of_requests_to_retry.empty():
                        next_request = queue_of_requests_to_retry.get_nowait()
                    else:
                        next_request = read_request(
                            requests, next(task_id_generator), api_endpoint, max_attempts
                        )
                        if next_request is not None:
                            status_tracker.num_tasks_started += 1
                            status_tracker.num_tasks_in_progress += 1

                # if there is capacity enough, call the API
                buckets.refill()
                if next_request is not None and buckets.take(next_request.token_consumption):
                    next_request.attempts_left -= 1
                    task = asyncio.create_task(
                        next_request.call_api(
                            session=session,
                            request_url=request_url,
                            request_header=request_header,
                            retry_queue=queue_of_requests_to_retry,
                            save_filepath=save_filepath,
                            status_tracker=status_tracker,
                        )
                    )
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    next_request = None

                if status_tracker.num_tasks_in_progress == 0:
                    break

                # the main loop sleeps briefly so the requests in flight can run
                await asyncio.sleep(SECONDS_TO_SLEEP_EACH_LOOP)

                # after a rate-limit error, everything pauses to cool down
                seconds_since_rate_limit_error = (
                    time.time() - status_tracker.time_of_last_rate_limit_error
                )
                if seconds_since_rate_limit_error < seconds_to_pause_after_rate_limit_error:
                    remaining_seconds_to_pause = (
                        seconds_to_pause_after_rate_limit_error - seconds_since_rate_limit_error
                    )
                    await asyncio.sleep(remaining_seconds_to_pause)
                    log.warning("Paused to cool down for %.1f s", remaining_seconds_to_pause)
    return status_tracker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("requests_filepath", type=Path, help="JSONL of request bodies")
    parser.add_argument("--url", required=True, help="the endpoint every request is POSTed to")
    parser.add_argument("--rpm", type=float, default=1500, help="requests a minute")
    parser.add_argument("--tpm", type=float, default=125_000, help="tokens a minute")
    parser.add_argument("--window", type=float, default=60.0, help="seconds in a minute")
    parser.add_argument("-o", "--output", type=Path, help="default: INPUT_results.jsonl")
    parser.add_argument("--api-key", default=os.getenv("OPENAI_API_KEY", "sk-none"))
    parser.add_argument("--max-attempts", type=int, default=5)
    parser.add_argument("--logging-level", type=int, default=logging.ERROR)
    args = parser.parse_args()
    logging.basicConfig(level=args.logging_level)
    output = args.output or args.requests_filepath.with_name(
        args.requests_filepath.stem + "_results.jsonl"
    )
    started = time.monotonic()
    tracker = asyncio.run(
        process_api_requests_from_file(
            requests_filepath=args.requests_filepath,
            save_filepath=output,
            request_url=args.url,
            api_key=args.api_key,
            max_requests_per_minute=args.rpm,
            max_tokens_per_minute=args.tpm,
            max_attempts=args.max_attempts,
            minute=args.window,
        )
    )
    print(json.dumps({**asdict(tracker), "seconds": round(time.monotonic() - started, 3)}))


if __name__ == "__main__":
    main()
