#!/usr/bin/env python3
"""Counts test cases from Bazel's test.xml files and prints 'N passed, M failed, K skipped'.

A test target with no test.xml (it did not build, or crashed before writing one) counts as
one failed test. Exits non-zero when anything failed or --status says the build failed.
"""
import argparse
import os
import sys
import xml.etree.ElementTree as ET


def xml_path(testlogs, label):
    pkg, _, name = label.lstrip("/").partition(":")
    return os.path.join(testlogs, pkg, name, "test.xml")


def count(path):
    passed = failed = skipped = 0
    failures = []
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        name = "%s.%s" % (case.get("classname", ""), case.get("name", ""))
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
            failures.append(name)
        elif case.find("skipped") is not None or case.get("result") == "skipped" \
                or case.get("status") == "notrun":
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped, failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--status", type=int, default=0)
    ap.add_argument("--testlogs", default="bazel-testlogs")
    ap.add_argument("--asan-testlogs", default="bazel-asan-testlogs")
    ap.add_argument("--extra-testlogs", action="append", default=[],
                    help="a folder whose every test.xml is counted (e.g. tools/fuzz.sh's)")
    ap.add_argument("--tsan-testlogs", default="bazel-tsan-testlogs")
    ap.add_argument("--tsan-targets", nargs="*", default=[],
                    help="targets that also ran under ThreadSanitizer (read from --tsan-testlogs)")
    ap.add_argument("targets", nargs="*")
    args = ap.parse_args()

    # The first occurrence of a label reads the main logs; a repeat (asan list) reads asan logs;
    # --tsan-targets read the tsan logs.
    seen = set()
    runs = []
    for label in args.targets:
        runs.append((label, args.asan_testlogs if label in seen else args.testlogs,
                     " [asan]" if label in seen else ""))
        seen.add(label)
    runs += [(label, args.tsan_testlogs, " [tsan]") for label in args.tsan_targets]
    totals = [0, 0, 0]
    problems = []
    for label, logs, tag in runs:
        path = xml_path(logs, label)
        if not os.path.exists(path):
            totals[1] += 1
            problems.append("%s%s: no test.xml (did not build or did not run)" % (label, tag))
            continue
        try:
            p, f, s, names = count(path)
        except ET.ParseError as e:
            totals[1] += 1
            problems.append("%s%s: unreadable test.xml: %s" % (label, tag, e))
            continue
        if p + f + s == 0:
            p = 1  # a plain (non-gtest) test that passed writes one synthesized case
        totals[0] += p
        totals[1] += f
        totals[2] += s
        problems += ["%s%s: %s" % (label, tag, n) for n in names]
    for folder in args.extra_testlogs:
        for root, _, files in sorted(os.walk(folder)):
            if "test.xml" not in files:
                continue
            p, f, s, names = count(os.path.join(root, "test.xml"))
            totals[0] += p
            totals[1] += f
            totals[2] += s
            problems += ["%s: %s" % (os.path.relpath(root, folder), n) for n in names]
    for line in problems:
        print("FAILED: " + line)
    failed = totals[1] + (1 if args.status and totals[1] == 0 else 0)
    print("%d passed, %d failed, %d skipped" % (totals[0], failed, totals[2]))
    return 1 if failed or args.status else 0


if __name__ == "__main__":
    sys.exit(main())
