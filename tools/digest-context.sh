#!/bin/sh
# Prefetch for the digest task: recent commits and open failure cards, as markdown.
# Deterministic and read-only; the runtime appends its output to the prompt.
set -u
echo "## Recent commits"
if git rev-parse --verify -q HEAD >/dev/null 2>&1; then
  git log -n 20 --pretty='- %h %ad %an: %s' --date=short
else
  echo "(no commits yet)"
fi
echo
echo "## Open cards"
found=0
if [ -d cards ]; then
  for f in $(grep -rl '^status: open' cards 2>/dev/null | sort | tail -n 30); do
    kind=$(sed -n 's/^kind: //p' "$f" | head -n 1)
    summary=$(sed -n 's/^summary: //p' "$f" | head -n 1)
    echo "- $kind: $summary ($f)"
    found=1
  done
fi
[ "$found" = 1 ] || echo "(none)"
