#!/bin/sh
# Every relative link in the repository's Markdown resolves: [text](path)
# names a file or directory that exists, and [text](path.md#anchor) or
# [text](#anchor) a heading (GitHub's anchors) or an <a id> that exists. No .md file is
# over 60 KB (issue 52: a reference a reader can search, not a notebook).
# Links inside code spans and fenced blocks are not links and are skipped.
# Usage: sh tests/static/doc_links.sh   (from the repository root)
PYTHON=${PYTHON:-python3}
script=$(cat <<'EOF'
import os, re, sys

MAX = 60 * 1024
files = [l.strip() for l in sys.stdin if l.strip() and os.path.isfile(l.strip())]
link = re.compile(r'(?<!\!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')

def prose(text):
    """The text outside fenced blocks, with inline code removed."""
    out, fence = [], None
    for line in text.split('\n'):
        m = re.match(r'\s*(```+|~~~+)', line)
        if m:
            if fence is None:
                fence = m.group(1)[0] * 3
            elif m.group(1).startswith(fence):
                fence = None
            out.append('')
            continue
        out.append('' if fence else re.sub(r'(`+)(?:(?!\1).)+?\1', '', line))
    return out

anchors_cache = {}
def anchors(path):
    if path not in anchors_cache:
        anchors_cache[path] = heading_anchors(path)
    return anchors_cache[path]

def heading_anchors(path):
    """GitHub's heading anchors: lower case, punctuation but '-' and '_' dropped
    (inline code keeps its text), spaces to '-', repeats numbered -1, -2, ..."""
    seen, found, fence = {}, set(), None
    for line in open(path, encoding='utf-8').read().split('\n'):
        m = re.match(r'\s*(```+|~~~+)', line)
        if m:
            fence = None if fence else m.group(1)[0]
            continue
        if fence:
            continue
        for a in re.findall(r'<a\s+(?:id|name)="([^"]+)"', line):
            found.add(a)
        m = re.match(r'\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$', line)
        if m:
            s = re.sub(r'[^\w\- ]', '', m.group(1).lower()).replace(' ', '-')
            n = seen.get(s, 0)
            seen[s] = n + 1
            found.add(s if n == 0 else '%s-%d' % (s, n))
    return found

bad = 0
checked = 0
for f in files:
    size = os.path.getsize(f)
    if size > MAX:
        print('FAIL: %s is %d bytes, over %d' % (f, size, MAX))
        bad = 1
    for no, line in enumerate(prose(open(f, encoding='utf-8').read()), 1):
        for m in link.finditer(line):
            target = m.group(1)
            if re.match(r'[a-z][a-z0-9+.-]*:', target, re.I):  # http:, mailto:, ...
                continue
            path, _, anchor = target.partition('#')
            dest = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
            checked += 1
            if not os.path.exists(dest):
                print('FAIL: %s:%d: link %s: no file %s' % (f, no, target, dest))
                bad = 1
            elif anchor and dest.endswith('.md') and anchor not in anchors(dest):
                print('FAIL: %s:%d: link %s: no heading #%s in %s' % (f, no, target, anchor, dest))
                bad = 1
if not bad:
    print('ok: %d relative links in %d .md files resolve; none is over 60 KB' % (checked, len(files)))
sys.exit(bad)
EOF
)
# the repository's .md files (tracked or not, but not ignored); outside a
# git checkout, every .md file under the current directory but build/
list_md() {
    if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        git ls-files -- '*.md'; git ls-files --others --exclude-standard -- '*.md'
    else
        find . -name '*.md' -not -path './build/*' -not -path './.git/*' | sed 's|^\./||'
    fi
}
list_md | grep -v '^build/' | sort -u | "$PYTHON" -c "$script"
