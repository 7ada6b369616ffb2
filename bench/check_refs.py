#!/usr/bin/env python3
"""Markdown references that a removal broke.

    python3 bench/check_refs.py [REV]

Lists every path-like name in the repository's markdown files (outside
fenced code blocks, which show commands as they were run) that named a file
tracked at REV (default: HEAD) and names none in the working tree now:
run it before committing a removal, such as raw logs leaving bench/results
(bench/README.md, "How results are kept"). Names are resolved as the
history READMEs write them: from the file's folder, from the repository
root, or as the end of a path under the file's folder. Exits 1 when any
reference is broken.
"""
import fnmatch
import os
import re
import subprocess
import sys

root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True).stdout.strip()
os.chdir(root)
rev = sys.argv[1] if len(sys.argv) > 1 else "HEAD"
before = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev], capture_output=True, text=True, check=True).stdout.split()
now = [p for p in before if os.path.exists(p)]
files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
                       capture_output=True, text=True, check=True).stdout.split()
markdown = [p for p in files if not p.startswith("vendor/") and os.path.exists(p)]
NAME = re.compile(r"[A-Za-z0-9_.*\-/]+\.[A-Za-z0-9*]+")
FENCED = re.compile(r"(?ms)^```.*?^```")


def resolve(md, name, paths):
    folder = os.path.dirname(md)
    hits = set()
    for path in paths:
        if fnmatch.fnmatch(path, os.path.normpath(os.path.join(folder, name))) or fnmatch.fnmatch(path, name):
            hits.add(path)
        elif folder and path.startswith(folder + "/") and fnmatch.fnmatch(path, "*/" + name):
            hits.add(path)
    return hits


broken = 0
for md in sorted(markdown):
    text = FENCED.sub("", open(md, encoding="utf-8").read())
    for name in sorted(set(NAME.findall(text))):
        # `*.log` and the like name a kind of file, not a file.
        if name.startswith(("http", "www", "*.")):
            continue
        was = resolve(md, name, before)
        if was and not resolve(md, name, now):
            print(f"{md}: `{name}` named {sorted(was)[0]}, which is gone")
            broken += 1
print(f"{broken} broken reference(s)" if broken else "no broken references")
sys.exit(1 if broken else 0)
