#!/usr/bin/env python3
"""Checks every relative link and image in the given markdown files: the target exists, and an anchor
names a heading of the target (GitHub's slugs). Prints each broken link; exit 1 if any.

    python3 scripts/check_links.py README.md docs/*.md benchmarks/RESULTS.md
"""
import os, re, sys

def slugs(path):
    out, seen = set(), {}
    in_code = False
    for line in open(path, encoding='utf-8'):
        if line.startswith('```'):
            in_code = not in_code
            continue
        if in_code:
            continue
        m = re.match(r'^(#{1,6})\s+(.*?)\s*#*\s*$', line)
        if not m:
            continue
        text = m.group(2)
        text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', text)
        s = text.strip().lower()
        s = re.sub(r'[^\w\- ]', '', s, flags=re.UNICODE)
        s = s.replace(' ', '-')
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f'{s}-{n}')
    return out

def links(path):
    in_code = False
    for no, line in enumerate(open(path, encoding='utf-8'), 1):
        if line.startswith('```'):
            in_code = not in_code
            continue
        if in_code:
            continue
        line = re.sub(r'`[^`]*`', '', line)  # inline code is not a link
        for m in re.finditer(r'!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)', line):
            yield no, m.group(1)

bad = 0
checked = 0
for md in sys.argv[1:]:
    base = os.path.dirname(md)
    for no, target in links(md):
        if re.match(r'^[a-z]+:', target):
            continue
        checked += 1
        path, _, anchor = target.partition('#')
        full = os.path.normpath(os.path.join(base, path)) if path else md
        if not os.path.exists(full):
            print(f'{md}:{no}: {target}: no such file {full}'); bad += 1; continue
        if anchor:
            if not full.endswith('.md'):
                print(f'{md}:{no}: {target}: anchor on a non-markdown file'); bad += 1
            elif anchor not in slugs(full):
                print(f'{md}:{no}: {target}: no heading #{anchor} in {full}'); bad += 1
print(f'{checked} relative links checked, {bad} broken')
sys.exit(1 if bad else 0)
