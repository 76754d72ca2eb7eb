"""A regular file standing in for /dev/kmsg: records appended to it are read one by one, as the device gives them."""

from __future__ import annotations

import os
from typing import Any


def kmsg_record(seq: int, message: str, usec: int | None = None) -> str:
    """One record as /dev/kmsg gives it: `PRIORITY,SEQ,USEC,FLAGS;MESSAGE` (USEC: microseconds since boot)."""
    return f"6,{seq},{seq * 1000 if usec is None else usec},-;{message}\n"


class OneRecordPerRead:
    """The os module as kernel.py sees it, with a read that returns one record (a line), as /dev/kmsg does."""

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    @staticmethod
    def read(fd: int, size: int) -> bytes:
        record = b""
        while not record.endswith(b"\n") and len(record) < size:
            byte = os.read(fd, 1)
            if not byte:
                break
            record += byte
        return record
