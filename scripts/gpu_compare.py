#!/usr/bin/env python3
"""The verdicts of scripts/gpu-acceptance.sh's GPU steps (in python3: the GPU image has no jq).

    gpu_compare.py losses A.jsonl B.jsonl TOL
        the largest relative difference of the per-step losses (--log-json) within TOL
    gpu_compare.py within-effect A.jsonl B.jsonl FP32.jsonl BF16.jsonl FACTOR
        the same, within FACTOR times what bf16 changes (FP32 against BF16: one run in both dtypes)
    gpu_compare.py resumed RESUMED.jsonl FULL.jsonl TOL
        a run resumed from a checkpoint of a run like FULL, against FULL's same steps: it must end
        where FULL ends, each of its steps within TOL
    gpu_compare.py gtest REPORT.json...
        GoogleTest's JSON reports: tests ran, none failed, none skipped

Prints the figures as one JSON line; exits 0 when the verdict is a pass, 1 otherwise.
"""
import json
import sys


def steps(path):
    with open(path) as f:
        return {r["step"]: r["loss"] for r in (json.loads(line) for line in f if line.strip())}


def losses(path):
    with open(path) as f:
        return [json.loads(line)["loss"] for line in f if line.strip()]


def max_rel_diff(a, b):
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def gtest(path):
    doc = json.load(open(path))
    res = {"tests": 0, "failed": [], "skipped": []}
    for suite in doc["testsuites"]:
        for t in suite["testsuite"]:
            res["tests"] += 1
            name = f'{suite["name"]}.{t["name"]}'
            if t.get("failures"):
                res["failed"].append(name)
            if t.get("result") == "SKIPPED" or t.get("status") == "NOTRUN":
                res["skipped"].append(name)
    return res


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd in ("losses", "within-effect"):
        a, b = losses(sys.argv[2]), losses(sys.argv[3])
        ok = len(a) == len(b) and len(a) > 0
        r = max_rel_diff(a, b) if ok else float("inf")
        out = {"steps": len(a), "max_rel_diff": r, "first": [a[:1], b[:1]], "last": [a[-1:], b[-1:]]}
        if cmd == "losses":
            tol = float(sys.argv[4])
        else:
            f, h = losses(sys.argv[4]), losses(sys.argv[5])
            out["bf16_effect"] = max_rel_diff(f, h)
            tol = float(sys.argv[6]) * out["bf16_effect"]
        out["tol"] = tol
        print(json.dumps(out))
        sys.exit(0 if ok and r <= tol else 1)
    if cmd == "resumed":
        resumed, full = steps(sys.argv[2]), steps(sys.argv[3])
        ok = bool(resumed) and resumed.keys() <= full.keys() and max(resumed) == max(full)
        r = max_rel_diff(resumed.values(), [full[s] for s in resumed]) if ok else float("inf")
        tol = float(sys.argv[4])
        print(json.dumps({"steps": len(resumed), "from_step": min(resumed, default=None), "max_rel_diff": r,
                          "tol": tol}))
        sys.exit(0 if ok and r <= tol else 1)
    if cmd == "gtest":
        total = {"tests": 0, "failed": [], "skipped": []}
        for path in sys.argv[2:]:
            r = gtest(path)
            total["tests"] += r["tests"]
            total["failed"] += r["failed"]
            total["skipped"] += r["skipped"]
        print(json.dumps(total))
        sys.exit(0 if total["tests"] and not total["failed"] and not total["skipped"] else 1)
    sys.exit(__doc__)
