#!/usr/bin/env bash
# Make `hwlab` a command of every new shell: a link ~/.local/bin/hwlab -> this checkout's
# .venv/bin/hwlab (the user's own bin folder, where pip --user and pipx put commands; nothing
# else of the venv, no python or pip, lands on the PATH). Then a new login shell is asked
# whether it finds `hwlab`; if not (~/.local/bin is not on its PATH), the one line that puts
# it there is printed, not written: the user's shell files are the user's.
# An existing ~/.local/bin/hwlab that is not this checkout's is left as it is, and said.
set -euo pipefail
cd "$(dirname "$0")/.."
target="$PWD/.venv/bin/hwlab"
bin="$HOME/.local/bin"
link="$bin/hwlab"
if [ ! -x "$target" ]; then
  echo "link_cli: $target is missing: run bash scripts/setup.sh first" >&2
  exit 2
fi
mkdir -p "$bin"
if [ -L "$link" ] || [ -e "$link" ]; then
  if [ "$(readlink -f "$link")" != "$(readlink -f "$target")" ]; then
    echo "hwlab: $link already exists and is not this checkout's (it is $(readlink -f "$link")):" \
         "left as it is; run this checkout's as $target"
    # whether that other link is even found: ~/.local/bin may be off the PATH of new shells
    other=$(env -i HOME="$HOME" USER="${USER:-}" LOGNAME="${LOGNAME:-}" TERM=dumb bash -lc 'command -v hwlab' \
            2>/dev/null || true)
    if [ -z "$other" ] || [ "$(readlink -f "$other")" != "$(readlink -f "$link")" ]; then
      echo "hwlab: note: $bin is not on your new shells' PATH either, so neither link is found there;" \
           "add it with: echo 'export PATH=\"\$HOME/.local/bin:\$PATH\"' >> ~/.profile"
    fi
    exit 0
  fi
else
  ln -s "$target" "$link"
fi
# a new login shell, as a new terminal starts one: only HOME and the system's profile
found=$(env -i HOME="$HOME" USER="${USER:-}" LOGNAME="${LOGNAME:-}" TERM=dumb bash -lc 'command -v hwlab' \
        2>/dev/null || true)
if [ -n "$found" ] && [ "$(readlink -f "$found")" = "$(readlink -f "$target")" ]; then
  echo "hwlab: the command is ready in new shells ($link -> $target)"
  exit 0
fi
# the file a bash login shell reads (the first of these that exists), else ~/.profile
rc="$HOME/.profile"
for f in "$HOME/.bash_profile" "$HOME/.bash_login"; do
  if [ -f "$f" ]; then rc=$f; break; fi
done
case "${SHELL:-}" in */zsh) rc="$HOME/.zprofile" ;; esac
echo "hwlab: linked $link -> $target; $bin is not on your shells' PATH. Run this once, then open a new shell:"
echo "  echo 'export PATH=\"\$HOME/.local/bin:\$PATH\"' >> ${rc/#$HOME/~}"
