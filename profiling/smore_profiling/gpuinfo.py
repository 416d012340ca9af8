"""Device name, driver version and SM utilization sampling via nvidia-smi (no extra packages)."""
import subprocess
import threading
import time


def query(fields, gpu=0):
    out = subprocess.run(["nvidia-smi", f"--id={gpu}", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                         check=True, capture_output=True, text=True).stdout.strip()
    return [s.strip() for s in out.split(",")]


def device_and_driver(gpu=0):
    name, driver = query("name,driver_version", gpu)
    return name, driver


class UtilSampler:
    """Samples utilization.gpu (percent) every `period` s in a thread; `mean()` as a fraction."""

    def __init__(self, gpu=0, period=0.1):
        self.gpu, self.period, self.samples, self._stop = gpu, period, [], threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                self.samples.append(float(query("utilization.gpu", self.gpu)[0]))
            except Exception:
                pass
            time.sleep(self.period)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()

    def mean(self):
        return sum(self.samples) / len(self.samples) / 100.0 if self.samples else float("nan")
