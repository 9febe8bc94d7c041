"""Two guards of the probe's script, kept apart for size: the look for a stuck nvidia-smi of
the probe's own, and the watchdog that ends a probe whose channel is gone. Both are bash text
using the script's helpers and variables (``SD``: the private folder of the probe's records).
"""

from __future__ import annotations

# A hung driver leaves nvidia-smi in the kernel (state D), where no kill reaches it: each new query
# would leave one more. One of ours stuck, or older than our own limit: ask nothing.
#
# "Ours" only by facts no other user can fake (own_query): the real, effective and saved uids
# are all the probe's, and the argv is exactly one of this probe's queries (after at most an
# interpreter and its one option). A setuid program keeps its caller's real uid, so a user's
# setuid-root "nvidia-smi" never counts; the argv tells our queries from our account's others.
#
# Where to look without a step per process: each query records "PID START-TICKS" before it
# execs nvidia-smi (so a probe killed at any moment leaves it recorded) in the account's private
# runtime folder (SD: /run/user/UID, logind's, mode 0700, tmpfs: never an NFS home), and the
# check reads only those, each checked against /proc (PID reuse cannot match) and own_query. No
# other user can write there, to hide or plant a record. Records rotate through three files by
# the minute of uptime: a probe appends to this minute's and, in a minute's first half, moves the
# live records of the file two minutes old into it, so no file grows and concurrent probes lose
# no appends (bash can append, not lock or rename). A stuck query stays live for ever.
#
# Where the records cannot be trusted (no folder, or no "ok" mark: the first probe after a boot
# or a failed record), the whole /proc walk (stuck_walk) runs, records what it finds, then marks.
STUCK = r"""uptime_ticks() {  # /proc/uptime ("12345.67") in clock ticks, in up
  local i f
  up=0; { read -r up _ </proc/uptime; } 2>/dev/null
  i=${up%%.*} f=; [[ $up == *.* ]] && f=${up#*.}
  num "$i" && [[ $f != *[!0-9]* ]] || { up=0; return; }
  f+=00
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
query_at() {  # /proc/$1 (started at $2, if given): 0 our query, 1 not, 2 not that process
  local s
  local -a U A
  rd "/proc/$1/stat"; s=$R
  [[ $s == *')'* ]] || return 2
  fields "$s"  # in the caller's F
  [[ -z $2 || ${F[19]} == "$2" ]] || return 2
  [[ ${F[0]} == [ZX] ]] && return 2
  num "${F[19]}" || return 1
  rd "/proc/$1/status"; uid_fields "$R"
  A=(); { mapfile -t -d '' -n 8 A <"/proc/$1/cmdline"; } 2>/dev/null
  own_query
}
is_stuck() {  # our query $1, its stat fields in F: adds "PID STATE AGE" to out when stale
  local age
  [[ -n $up ]] || uptime_ticks
  # in clock ticks: whole seconds on both sides would round an age of 2.6 s down to 2
  age=$(( up - 10#${F[19]} ))
  stale "${F[0]}" "$age" && out+="$1 ${F[0]} $(( age / TCK ))"$'\n'
  return 0
}
# rec PID: record query PID in this minute's file (in the query's job, before it execs). A record
# that cannot be written empties the mark: the next probe walks /proc.
rec() {
  [[ -n $SD ]] || return 0
  local -a F
  rd "/proc/$1/stat"; [[ $R == *')'* ]] && fields "$R"
  uptime_ticks
  local q=$SD/gpubot-probe.q$(( up / (60 * TCK) % 3 ))
  { printf '%s %s\n' "$1" "${F[19]}" >>"$q"; } 2>/dev/null && return 0
  { : >"$SD/gpubot-probe.ok"; } 2>/dev/null
}
stuck_smi() {  # our stuck queries, "PID STATE AGE" lines, in R
  local up= out=
  local -a F
  R=
  if [[ -n $SD ]] && { rd "$SD/gpubot-probe.ok"; [[ $R == ok ]]; }; then stuck_recorded
  else stuck_walk; fi
  R=$out
}
# Most records are of queries long done (a few a probe, kept for up to three minutes): each costs
# a lookup and a stat, nothing more; only a record whose process is there is read and checked.
stuck_recorded() {
  local k e p s b r now old keep= q=$SD/gpubot-probe.q
  local -a L
  local -A seen=()
  uptime_ticks; b=$(( up / (60 * TCK) ))
  now=$(( b % 3 )) old=$(( (b + 1) % 3 ))
  for k in $(( (b + 2) % 3 )) "$now" "$old"; do
    L=(); { mapfile -t L <"$q$k"; } 2>/dev/null
    for e in "${L[@]}"; do
      p=${e% *}
      [[ -d /proc/$p ]] || continue  # gone: not carried
      s=${e#* }  # "PID START": two numbers, one space
      [[ $e == [0-9]*' '[0-9]* && $p$s != *[!0-9]* && -z ${seen[$e]} ]] || continue
      seen[$e]=1
      over && { m over "$B" stuck; m end; exit 0; }
      query_at "$p" "$s"; r=$?
      (( r == 0 )) && is_stuck "$p"
      (( r < 2 && k == old )) && keep+="$e"$'\n'  # that process still: carried
    done
  done
  # The first half of a minute: the file two minutes old takes no more appends (those go to this
  # minute's), so its live records move here and it is emptied, if this is still that half.
  (( up % (60 * TCK) < 30 * TCK )) && [[ -s $q$old ]] || return 0
  { printf '%s' "$keep" >>"$q$now"; } 2>/dev/null || return 0
  uptime_ticks
  (( up / (60 * TCK) == b && up % (60 * TCK) < 30 * TCK )) || return 0
  { : >"$q$old"; } 2>/dev/null
  return 0
}
stuck_walk() {  # every process of ours on the node; records what it finds, then writes the mark
  local d p c found=
  local -a dirs
  set +f; dirs=(/proc/[0-9]*); set -f
  for d in "${dirs[@]}"; do
    over && { m over "$B" stuck; m end; exit 0; }
    [[ -O $d ]] || continue  # a process of ours: a stat, cheaper than reading its name
    c=; { IFS= read -r c <"$d/comm"; } 2>/dev/null
    [[ $c == nvidia-smi ]] || continue
    p=${d#/proc/}
    query_at "$p" || continue  # another nvidia-smi of ours (dmon, -l 5): not a query
    found+="$p ${F[19]}"$'\n'
    is_stuck "$p"
  done
  [[ -n $SD ]] || return 0
  uptime_ticks
  { printf '%s' "$found" >>"$SD/gpubot-probe.q$(( up / (60 * TCK) % 3 ))" \
    && printf 'ok\n' >"$SD/gpubot-probe.ok"; } 2>/dev/null
  return 0
}
stale() {  # whether one of our queries in state $1, $2 clock ticks old, is stuck
  # Past twice our own limit: stuck whatever its state. In state D (in the kernel) only once it is
  # older than one query's limit: another probe of this node's running at the same moment has its
  # own query in a driver call (state D for a moment), and that one must not read as hung.
  (( $2 > (2 * ${T%%.*} + 2) * TCK )) || { [[ $1 == D ]] && (( $2 > ${T%%.*} * TCK )); }
}
"""

# A probe gpubot gave up on must not go on: sshd passes no signal on and keeps the session's
# processes when the channel closes, which the script sees only when it next writes. The
# watchdog, a fork, writes an empty line to stderr every half second (read -t on its own pipe is
# its sleep); once that fails it kills the probe's process group (or the probe, leading none).
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
