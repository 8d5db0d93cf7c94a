"""Transport policy that needs no socket."""

from __future__ import annotations

import pytest

from batchsync.transport import _passes_end


@pytest.mark.parametrize(
    ("timeout", "left", "passes"),
    [
        (None, 5.0, True),  # a blocking socket always gets a timeout
        (10.0, 10.0, False),  # the reply came at once: the send-time timeout still fits
        (10.0, 9.85, False),  # 0.15 s over: within 2 % of the attempt's 10 s
        (10.0, 9.7, True),  # late headers: re-arm to the time left
        (1.0, 0.97, False),  # within the 50 ms floor
        (1.0, 0.94, True),
        (0.5, 3.0, False),  # already shorter than the time left
    ],
)
def test_a_read_timeout_is_re_armed_only_when_it_could_pass_the_attempt_end(
    timeout: float | None, left: float, passes: bool
) -> None:
    assert _passes_end(timeout, left) is passes
