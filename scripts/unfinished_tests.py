"""Name the tests a pytest run selected but did not finish (a run its timeout stopped): those that
``pytest --collect-only`` of the same arguments lists and the run's JUnit XML (``--junitxml``) has no result
for. `scripts/gpu_check.sh` runs it after a stopped run, so the next device call can run exactly those.

    python3 scripts/unfinished_tests.py --xml run.xml --out not_finished.txt -- tests -k "cuda and not inductor"

Prints how many of the selected tests have a result and how many do not, and writes the ids of the latter to
``--out``, one per line (arguments for a next ``pytest`` run).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import xml.etree.ElementTree as ET


def junit_key(nodeid: str) -> tuple[str, str]:
    """A test id as pytest's JUnit XML names it: (classname, name), ``tests/test_a.py::Cls::test_b[x]`` ->
    (``tests.test_a.Cls``, ``test_b[x]``)."""
    path, *rest = nodeid.split("::")
    module = path.removesuffix(".py").replace("/", ".")
    return ".".join([module, *rest[:-1]]), rest[-1]


def without_group(name: str) -> str:
    """A JUnit test name without the ``@group`` that pytest-xdist's ``--dist loadgroup`` appends to a test marked
    ``xdist_group`` (``test_b[x]@gpu_memory`` -> ``test_b[x]``); an ``@`` inside the parameters' brackets stays."""
    head, bracket, tail = name.rpartition("]")
    return head + bracket + tail.split("@")[0] if bracket else name.split("@")[0]


def unfinished(collected: list[str], xml_path: str) -> list[str]:
    """The ids of ``collected`` with no test case in the JUnit XML at ``xml_path`` (all of them where the file
    is missing or cut short)."""
    try:
        done = {(case.get("classname"), without_group(case.get("name") or ""))
                for case in ET.parse(xml_path).iter("testcase")}
    except (OSError, ET.ParseError):
        done = set()
    return [nodeid for nodeid in collected if junit_key(nodeid) not in done]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--xml", required=True, help="the stopped run's --junitxml file")
    parser.add_argument("--out", required=True, help="where to write the unfinished tests' ids")
    parser.add_argument("pytest_args", nargs="*", help="the run's test selection (after --)")
    args = parser.parse_args()
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             *args.pytest_args], capture_output=True, text=True)
    collected = [line for line in listed.stdout.splitlines() if "::" in line]
    if not collected:
        print(f"unfinished_tests: pytest --collect-only listed no tests (exit {listed.returncode})", file=sys.stderr)
        return 1
    left = unfinished(collected, args.xml)
    with open(args.out, "w") as f:
        f.writelines(nodeid + "\n" for nodeid in left)
    print(f"tests with a result: {len(collected) - len(left)} of {len(collected)} selected; not finished: "
          f"{len(left)} (ids in {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
