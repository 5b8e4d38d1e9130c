"""FAKE rknn-toolkit2 worker that hangs (a hang cannot be produced on demand by the real one).

Same command line as rkpart/compile/worker_main.py (``build REQUEST.json``).  Before hanging
it leaves files where a real toolkit does (TMPDIR, HOME, the working directory, a partial
output next to the requested one) and starts a grandchild in its process group; it writes
the grandchild's pid and the paths it touched to ``config["fake_record"]``.
"""

import json
import os
import subprocess
import sys
import time


def main() -> int:
    with open(sys.argv[2]) as f:
        req = json.load(f)
    cfg = req["config"]
    touched = []
    for folder in (os.environ["TMPDIR"], os.environ["HOME"], os.getcwd()):
        p = os.path.join(folder, "toolkit-scratch.bin")
        with open(p, "wb") as f:
            f.write(b"\0" * 4096)
        touched.append(p)
    partial = req["output"] + ".12345.part"
    with open(partial, "wb") as f:
        f.write(b"half an rknn")
    touched.append(partial)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(cfg["fake_record"], "w") as f:
        json.dump({"grandchild": child.pid, "touched": touched}, f)
    time.sleep(600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
