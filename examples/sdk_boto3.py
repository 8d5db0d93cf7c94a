"""Many objects through boto3 with ``run_all``: S3's throttling (503 SlowDown, 429) waited
out and retried by batchsync, a missing key a final 404, every key its Result.

    python examples/sdk_boto3.py            # against the bundled mock bucket: no account
    S3_ENDPOINT_URL=... BUCKET=... python examples/sdk_boto3.py key1 key2 ...  # a real one

The pattern for any boto3 service: one client for all threads (boto3 clients are
thread-safe, sessions are not), botocore's own retries off so that batchsync's rate and
cooldown see every attempt, and the call returning what the Result should keep.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

import batchsync

ROOT = Path(__file__).resolve().parent.parent


def main(keys: list[str]) -> int:
    server = None
    endpoint = os.environ.get("S3_ENDPOINT_URL")
    bucket = os.environ.get("BUCKET", "s3-mock")
    if endpoint is None:  # the bundled mock bucket: some keys throttled once, one missing
        sys.path.insert(0, str(ROOT))
        from tests.mockserver import start_mock_server

        server = start_mock_server()
        endpoint = server.url
        keys = keys or [f"{'slowdown-once' if n % 4 == 1 else 'report'}-{n}.csv" for n in range(12)]
        keys.append("missing.csv")
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "mock")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "mock")
    s3 = boto3.client(
        "s3", endpoint_url=endpoint, region_name=os.environ.get("AWS_REGION", "us-east-1"),
        config=Config(retries={"total_max_attempts": 1}, s3={"addressing_style": "path"}),
    )  # fmt: skip

    def read(key: str) -> str:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        return str(body.decode())

    try:
        rs = batchsync.run_all(read, keys, concurrency=8, rate=50, attempts=4)
    finally:
        if server is not None:
            server.process.terminate()
    print(rs.summary())
    for result in rs:
        shown: Any = result.data if result.ok else f"{result.error_kind} {result.status_code}"
        print(f"{result.index:>2} tries {result.attempts}  {shown}")
    return 0 if all(r.ok or r.status_code == 404 for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
