"""How the live-save peers measure one save in this process: seconds, the RSS before it,
the growth of the peak RSS (VmHWM, reset through /proc/self/clear_refs just before),
and the growth of anonymous memory (what the save allocates, apart from file pages it
reads through a mapping), sampled every 5 ms from another process: a thread here would
not run while transformers' save holds the GIL."""
import os
import subprocess
import sys
import time


def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise SystemExit(f"no {key} in /proc/self/status")


SAMPLER = """
import sys, time
pid, peak = sys.argv[1], 0
def anon():
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
print("ready", flush=True)
while True:
    peak = max(peak, anon())
    if sys.stdin in __import__("select").select([sys.stdin], [], [], 0.005)[0]:
        break
print(max(peak, anon()), flush=True)
"""


def measure(save):
    """Runs `save()` and returns its figures as a dict."""
    before = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    anon_before = status("RssAnon")
    sampler = subprocess.Popen([sys.executable, "-c", SAMPLER, str(os.getpid())], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    sampler.stdout.readline()
    start = time.perf_counter()
    save()
    seconds = time.perf_counter() - start
    anon_peak = int(sampler.communicate("stop\n")[0].strip())
    return {"seconds": seconds, "rss_before": before, "growth": status("VmHWM") - before,
            "anon_growth": anon_peak - anon_before}
