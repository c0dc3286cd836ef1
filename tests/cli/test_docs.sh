# The README stays a short front page, and every relative link of the README, the docs and RESULTS.md
# leads to a file (and heading) that exists.
source "$(dirname "$0")/lib.sh"
cd "$ZSHARD_SRC" || exit 1
lines=$(wc -l <README.md)
if [ "$lines" -le 150 ]; then echo "ok   README.md is $lines lines"; else
  echo "FAIL README.md is $lines lines, more than 150"; failures=$((failures + 1)); fi
if python3 scripts/check_links.py README.md docs/*.md benchmarks/RESULTS.md >"$WORK/links" 2>&1; then
  echo "ok   $(tail -1 "$WORK/links")"
else echo "FAIL broken links:"; cat "$WORK/links"; failures=$((failures + 1)); fi
# A broken link is caught: the check is not one that always passes.
printf '[gone](no-such-page.md)\n' >"$WORK/broken.md"
if python3 scripts/check_links.py "$WORK/broken.md" >/dev/null 2>&1; then
  echo "FAIL a broken link passed the check"; failures=$((failures + 1)); else echo "ok   a broken link is caught"; fi
finish
