"""Two guards of the node probe's script (``probe_script``), kept apart for size: the look for a
stuck nvidia-smi of the probe's own, and the watchdog that ends a probe whose channel is gone.

Both are bash text using the helpers of ``probe_script._COMMON`` (``rd``, ``fields``,
``uid_fields``, ``over``, ``m``) and the script's variables (``smi``, ``me``, ``T``, ``B``,
``GQ``, ``AQ``).
"""

from __future__ import annotations

# A hung driver leaves nvidia-smi in the kernel (state D), where no kill reaches it: each new query
# would leave one more. One of ours stuck, or older than our own limit: ask nothing. What pgrep -x
# did, with builtins: each process's comm, then the rest only for a copy of nvidia-smi.
#
# "Ours" only by facts no other user can fake (own_query): the process's real, effective and saved
# uids are all the probe's, and its argv is exactly one of this probe's queries ("$smi" and the
# constant arguments, after at most an interpreter and its one option: a "#!" script). A setuid
# program keeps its caller's real uid, so a user's setuid-root program named nvidia-smi never
# counts, whatever its argv; only root or gpubot's own account can set all three uids, and the argv
# then tells our queries from that account's other nvidia-smi (dmon, -l 5, another query). No file
# of started PIDs: it would need a place on every node that only gpubot's account can write, and
# that survives the probe, is cleaned up, and is not shared between nodes (an NFS home).
STUCK = r"""uptime_ticks() {  # /proc/uptime ("12345.67") in clock ticks, in up
  local i f
  up=0; { read -r up _ </proc/uptime; } 2>/dev/null
  [[ $up =~ ^([0-9]+)(\.([0-9]*))?$ ]] || { up=0; return; }
  i=${BASH_REMATCH[1]} f=${BASH_REMATCH[3]}00
  up=$(( (10#$i * 100 + 10#${f:0:2}) * TCK / 100 ))
}
own_query() {  # the caller's uids (U) are the probe's and its argv (A) is one of our queries
  local i n
  [[ -n $me && ${U[0]} == "$me" && ${U[1]} == "$me" && ${U[2]} == "$me" ]] || return 1
  for (( i = 0; i < 3 && i < ${#A[@]}; i++ )); do
    [[ ${A[i]} == "$smi" ]] || continue
    n=$(( ${#A[@]} - i - 1 ))  # as many arguments as the query, and the same ones, in order
    (( n == ${#AQ[@]} )) && [[ "${A[*]:i+1}" == "${AQ[*]}" ]] && return 0
    (( n == ${#GQ[@]} )) && [[ "${A[*]:i+1}" == "${GQ[*]}" ]] && return 0
    (( n == ${#GQ[@]} + 2 )) && [[ "${A[*]:i+1:n-2}" == "${GQ[*]}" && ${A[i+n-1]} == -i \
      && ${A[i+n]} =~ ^[0-9,]+$ ]] && return 0
  done
  return 1
}
stuck_smi() {
  local d c p s x up= age out=
  local -a dirs F U A
  set +f; dirs=(/proc/[0-9]*); set -f
  for d in "${dirs[@]}"; do
    over && { m over "$B" stuck; m end; exit 0; }
    [[ -O $d ]] || continue  # a process of ours: a stat, cheaper than reading its name
    c=; { IFS= read -r c <"$d/comm"; } 2>/dev/null
    [[ $c == nvidia-smi ]] || continue
    rd "$d/stat"; s=$R; rd "$d/status"; x=$R
    [[ $s == *')'* ]] || continue
    uid_fields "$x"
    A=(); { mapfile -t -d '' -n 8 A <"$d/cmdline"; } 2>/dev/null
    own_query || continue
    fields "$s"
    [[ ${F[0]} == [ZX] || ! ${F[19]} =~ ^[0-9]+$ ]] && continue
    [[ -n $up ]] || uptime_ticks
    # in clock ticks: whole seconds on both sides would round an age of 2.6 s down to 2
    p=${d#/proc/}; age=$(( up - 10#${F[19]} ))
    stale "${F[0]}" "$age" && out+="$p ${F[0]} $(( age / TCK ))"$'\n'
  done
  R=$out
}
stale() {  # whether one of our queries in state $1, $2 clock ticks old, is stuck
  # Past twice our own limit: stuck whatever its state. In state D (in the kernel) only once it is
  # older than one query's limit: another probe of this node's running at the same moment has its
  # own query in a driver call (state D for a moment), and that one must not read as hung.
  (( $2 > (2 * ${T%%.*} + 2) * TCK )) || { [[ $1 == D ]] && (( $2 > ${T%%.*} * TCK )); }
}
"""

# A probe gpubot gave up on must not go on: OpenSSH's sshd passes no signal on and keeps the
# session's processes when the channel closes, which the script only sees when it next writes
# (and a query may wait T seconds first). The watchdog, a fork (no program), writes an empty line
# to stderr every half second (read -t on a pipe of its own is its sleep); once that write fails,
# the channel is gone: it kills the probe's process group (the probe leads one under sshd, the
# simulator's server and the local transport), or the probe alone where it leads none. The probe
# kills it on exit.
WATCHDOG = r"""watchdog() {
  local w g x
  trap '' PIPE
  exec >/dev/null {w}<> <(:)
  rd "/proc/$$/stat"; x=${R##*')'}; x=($x); g=${x[2]}
  while :; do
    read -r -t 0.5 -u "$w" _
    printf '\n' >&2 2>/dev/null || break
  done
  [[ $g == "$$" ]] && kill -KILL 0
  kill -KILL "$$"
}
"""
