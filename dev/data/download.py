"""dev/data/download.py: one file fetched over HTTP(S), whole or not at all (the corpus scripts'
shared step: tinyshakespeare.py, hellaswag.py)."""
import os
import urllib.request


def download(url, path, local_option="--input FILE", timeout_s=60):
    """Fetches url to path through a temporary name, renamed only once complete; exits 1 with the
    reason on any failure, naming `local_option`, the script's way to use a local copy instead."""
    print(f"downloading {url} -> {path}")
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response, open(tmp, "wb") as f:
            while chunk := response.read(1 << 20):
                f.write(chunk)
        os.replace(tmp, path)
    except Exception as e:  # URLError, HTTPError, timeouts, disk errors: all end the same way
        raise SystemExit(f"error: cannot download {url}: {e}\n"
                         f"       (no internet here? pass a local copy with {local_option})")
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
