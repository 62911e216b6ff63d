"""Everything the analysis measures on a GPU, in one call of the device machine.

Run from the repository root (the device machine's command, see analysis/README.md):

    PYTHONUNBUFFERED=1 python3 analysis/run_gpu.py --out "$OUT"

Measures the device ceilings, checks/times/profiles (ncu) every reference kernel variant and,
through target "all", the solver's cases (``kingen.analysis.solver_cases``);
then runs the tuner on the SGEMM variants. At most 8 files come back from $OUT: the ncu raw
outputs are packed into one tarball.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kingen.analysis.hardware import ceilings  # noqa: E402
from kingen.analysis.kernels import sgemm, stencil  # noqa: E402
from kingen.analysis.report import run_analyze  # noqa: E402
from kingen.analysis.tune import tune  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--target", default="all")  # "all" includes rk4 once the solver has cases
    p.add_argument("--size", default="default")
    a = p.parse_args()
    out: Path = a.out
    out.mkdir(parents=True, exist_ok=True)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,"
                          "clocks.sm,clocks.max.mem,memory.total,power.limit",
                          "--format=csv"], capture_output=True, text=True).stdout
    ncu = subprocess.run(["ncu", "--version"], capture_output=True, text=True).stdout
    (out / "device.txt").write_text(smi + ncu)
    print(smi + ncu)
    dev = ceilings(remeasure=True)
    (out / "ceilings.json").write_text(json.dumps(dev.to_json(), indent=2))
    work = out / "run"
    run_analyze(a.target, work, use_ncu=True, size=a.size, full=True)
    # the analysis' files first, so that a run cut short during tuning keeps them
    with tarfile.open(out / "ncu_raw.tar.gz", "w:gz") as tf:
        tf.add(work / "ncu", arcname="ncu")
    shutil.rmtree(work / "ncu")
    for f in work.iterdir():
        shutil.move(str(f), out / f.name)
    work.rmdir()
    tuned = {}
    for key, cases in ((f"stencil-{a.size}", stencil.cases(a.size)),
                       (f"sgemm-{a.size}", [c for c in sgemm.cases(a.size)
                                            if c.name != "sgemm_cublas"])):
        tuned[key] = tune(cases, key=key).to_json()
        print("tune:", json.dumps(tuned[key]))
        (out / "tune.json").write_text(json.dumps(tuned, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
