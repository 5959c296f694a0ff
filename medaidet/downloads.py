"""The one HTTP download loop (BCCD's archive, SSD's ImageNet weights). Failures are a
``"download"`` DataError (``offline``: whether being offline may be the cause)."""
from __future__ import annotations

import hashlib
import http.client
import time
import urllib.error
import urllib.request

from medaidet.errors import DataError

__all__ = ["stream_url"]

#: The longest a whole download may take (``timeout`` bounds each wait, not the sum).
DEADLINE_S = 3600.0


def stream_url(url: str, out, *, timeout: float, user_agent: str, desc: str,
               progress: bool = True, max_bytes: int | None = None,
               deadline_s: float = DEADLINE_S) -> tuple[int, str]:
    """Write what ``url`` answers into the binary file ``out``; returns (bytes, sha256 hex).
    Any failure, more than ``max_bytes`` or an overrun ``deadline_s`` is a DataError."""
    started = time.monotonic()
    try:
        response = urllib.request.urlopen(
            urllib.request.Request(url, headers={"User-Agent": user_agent}), timeout=timeout)
    except urllib.error.HTTPError as exc:
        raise DataError(f"the server answered HTTP {exc.code} {exc.reason}",
                        "download", offline=False) from None
    except (OSError, http.client.HTTPException, ValueError) as exc:   # a URLError: its reason
        raise DataError(f"{exc.reason}" if isinstance(exc, urllib.error.URLError)
                        else f"{type(exc).__name__}: {exc}", "download", offline=True) from None

    from tqdm.auto import tqdm
    digest = hashlib.sha256()
    with response:
        length = response.headers.get("Content-Length")
        total = int(length) if length and length.strip().isdigit() else None
        if total is not None and max_bytes is not None and total > max_bytes:
            raise DataError(f"it announces {total} bytes, more than the {max_bytes} allowed",
                            "download", offline=False)
        received = 0
        with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                  disable=not progress, leave=False) as bar:
            while True:
                if time.monotonic() - started > deadline_s:
                    raise DataError(f"it took longer than {deadline_s:g} s ({received} bytes "
                                    "received): the server or the network is too slow",
                                    "download", offline=True)
                try:
                    chunk = response.read1(1 << 20)   # what has arrived, not a full MB
                except (OSError, http.client.HTTPException) as exc:
                    raise DataError(f"the connection broke after {received} bytes "
                                    f"({type(exc).__name__}: {exc})",
                                    "download", offline=True) from None
                if not chunk:
                    break
                received += len(chunk)
                if max_bytes is not None and received > max_bytes:
                    raise DataError(f"more than {max_bytes} bytes", "download", offline=False)
                digest.update(chunk)
                out.write(chunk)
                bar.update(len(chunk))
    if total is not None and received != total:
        raise DataError(f"got {received} of the {total} bytes announced", "download", offline=True)
    return received, digest.hexdigest()
