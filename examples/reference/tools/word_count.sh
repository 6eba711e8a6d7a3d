#!/usr/bin/env bash
# Counts the words of input.text. stdin: {"tool", "call_id", "input": {"text": ...}, ...}
set -euo pipefail
req=$(cat)
text=$(printf '%s' "$req" | sed -n 's/.*"text":"\(\([^"\\]\|\\.\)*\)".*/\1/p')
words=$(printf '%s' "$text" | wc -w | tr -d ' ')
printf '{"words": %s}\n' "$words"
