#!/usr/bin/env python3
"""src/worker/public/mkheader.py OUT SRC_DIR BUILD_DIR - writes the installed
embstore.h: src/worker/embstore.h with each of its #include "..." lines
replaced by that header's body (what lies inside its include guard, less
its libc includes and the parts marked private), so the one installed file
includes libc headers only and every list (error codes, table counters)
still has a single source. Fails on any include it cannot inline and on a
libc include embstore.h itself lacks."""
import re
import sys

out, src, build = sys.argv[1:4]
PRIVATE_BEGIN = "/* private: not in the installed embstore.h */"
PRIVATE_END = "/* end private */"


def read(rel):
    for root in (build, src):
        try:
            with open(f"{root}/{rel}", encoding="utf-8") as f:
                return f.read()
        except FileNotFoundError:
            continue
    sys.exit(f"mkheader: {rel} not found")


def body(rel, libc):
    lines = read(rel).split("\n")
    guard = next(i for i, l in enumerate(lines) if l.startswith("#define "))
    end = max(i for i, l in enumerate(lines) if l.startswith("#endif"))
    kept, private = [], False
    for line in lines[guard + 1:end]:
        if line.strip() == PRIVATE_BEGIN:
            private = True
        elif line.strip() == PRIVATE_END:
            private = False
        elif private:
            continue
        elif line.startswith("#include <"):
            if line not in libc:
                sys.exit(f"mkheader: {rel}: {line} not in embstore.h")
        elif line.startswith('#include "'):
            sys.exit(f"mkheader: {rel}: {line} would not be inlined")
        else:
            kept.append(line)
    if private:
        sys.exit(f"mkheader: {rel}: private part not ended")
    text = "\n".join(kept).strip("\n")
    return f"/* ---- from {rel} ---- */\n{text}\n"


main = read("worker/embstore.h").split("\n")
libc = {l for l in main if l.startswith("#include <")}
res = []
for line in main:
    m = re.match(r'#include "([^"]+)"', line)
    res.append(body(m.group(1), libc) if m else line)
text = "\n".join(res)
text = text.replace(" * src/worker/embstore.h - ", " * embstore.h - ", 1)
with open(out, "w", encoding="utf-8") as f:
    f.write(text)
