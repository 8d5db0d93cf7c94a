"""Many prompts through the openai client with ``run_all``: every prompt gets its Result,
rate-limited, its 429s waited out (Retry-After, for every worker) and its 500s retried.

    python examples/sdk_openai.py          # against the bundled mock API: no key, no network
    OPENAI_BASE_URL=https://api.openai.com/v1 OPENAI_API_KEY=sk-... \\
        python examples/sdk_openai.py      # against a real one (mind the cost)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import openai

import batchsync

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    server = None
    base_url = os.environ.get("OPENAI_BASE_URL")
    if base_url is None:  # the bundled mock API, which answers some prompts 429 or 500 first
        sys.path.insert(0, str(ROOT))
        from tests.mockserver import start_mock_server

        server = start_mock_server()
        base_url = f"{server.url}/v1"
    # max_retries=0: batchsync retries, so that the rate and the cooldown see every attempt.
    client = openai.OpenAI(
        base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY", "sk-mock"), max_retries=0
    )
    model = os.environ.get("OPENAI_MODEL", "gpt-4o-mini")
    prompts = [f"{'429-once' if n % 5 == 1 else 'ok'}:Name a colour, {n}" for n in range(20)]

    def complete(prompt: str) -> str:
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=20
        )
        return str(reply.choices[0].message.content)

    try:
        rs = batchsync.run_all(complete, prompts, concurrency=4, rate=5, attempts=4)
    finally:
        if server is not None:
            server.process.terminate()
    print(rs.summary())
    for result in rs:
        shown: Any = result.data if result.ok else f"{result.error_kind}: {result.error}"
        print(f"{result.index:>2} tries {result.attempts}  {shown}")
    return 0 if not rs.failed else 1


if __name__ == "__main__":
    sys.exit(main())
