"""huggingface_hub itself fills a cache from devmap's local Hub-like test server, and
devmap must open the repo id where huggingface_hub's own lookup finds it.

Usage: python hub_cache.py PATH/TO/devmap ENDPOINT CACHE_DIR REPO FILE...
Exits non-zero on any mismatch.
"""

import json
import os
import subprocess
import sys

from huggingface_hub import hf_hub_download, snapshot_download


def main(devmap, endpoint, cache, repo, files):
    paths = [hf_hub_download(repo_id=repo, filename=f, cache_dir=cache, endpoint=endpoint) for f in files]
    snapshot = os.path.dirname(paths[0])
    # huggingface_hub's own offline resolution of the repo id.
    found = snapshot_download(repo_id=repo, cache_dir=cache, local_files_only=True)
    assert os.path.samefile(found, snapshot), (found, snapshot)
    assert all(os.path.islink(p) for p in paths), "huggingface_hub writes symlinks into blobs/"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env["HF_HUB_CACHE"] = cache
    r = subprocess.run([devmap, "inspect", repo, "--json"], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"FAIL: devmap inspect {repo}: {r.stderr}")
    report = json.loads(r.stdout)
    if not os.path.samefile(report["model"], snapshot):
        sys.exit(f"FAIL: devmap opened {report['model']}, huggingface_hub's snapshot is {snapshot}")
    kinds = [w["kind"] for w in report.get("warnings", [])]
    if "symlinks_outside" in kinds:
        sys.exit(f"FAIL: the cache's own symlinks are reported: {kinds}")
    print(f"ok: devmap opens {repo} at huggingface_hub's snapshot {os.path.basename(snapshot)} ({len(report['tensors'])} tensors)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
