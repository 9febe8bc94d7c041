"""The node probe's remote scripts: constant ``bash`` (4.4 or later) using builtins only.

A probe's remote work is paid by every node on every status and sweep, so the scripts start no
program they can do without: ``bash``, the two nvidia-smi queries and ``fuser`` (skipped by a
status whose memory adds up). Time limits, the look for a stuck nvidia-smi, fuser's filter, the
``/proc`` reads, escaping and owners' names are builtins; ``readlink`` runs only for a system
account's process (a daemon's executable is what protects it).

Bounded whatever the node holds: a holder of only ``nvidiactl``/``nvidia-uvm`` is counted, never
read; each escaped field is capped before escaping, and escaping costs a step per distinct byte,
not per byte; past its budget the script writes ``over`` and stops (the answer is unknown); a
watchdog ends the probe once its channel is gone.

Everything that varies arrives as positional arguments, so no text from a person or a node
reaches a shell unquoted. There is no per-call secret: anyone on the node can read them.

Framing without a secret: every byte a process controls about itself is escaped (printable ASCII
but space and backslash stays, the rest is ``\\ooo`` under ``LC_ALL=C``), so it can never hold a
newline and every section marker comes from the script. The other bodies are trusted programs'
output: nvidia-smi's tables (without ``process_name``) and fuser's without its COMMAND column.

Why bash and not POSIX ``sh``: ``dash`` has no timed ``read``, no NUL-separated argv and no byte
arithmetic, so each would cost a program per probe. 4.4 is the first bash that sets ``$!`` to a
process substitution and can ``wait`` for it; an older one stops the probe with a clear error.
"""

from __future__ import annotations

from gpubot.core.probe.guards import STUCK, WATCHDOG
from gpubot.core.probe.holders import ADDS_UP
from gpubot.core.probe.nvsmi import apps_query_argv, gpu_query_argv

MARK = "@gpubot"

# USER_HZ (/proc/PID/stat's start time unit) is 100 on every architecture NVIDIA's driver
# supports (include/asm-generic/param.h); getconf would be one more exec.
CLK_TCK = 100

# The marker printer, and the helpers every script shares. ``rd FILE``: the file's text (at most
# 8 KiB, without its last newline) in R, empty when unreadable. ``esc TEXT``: TEXT escaped as
# "=..." in R (at most 4096 bytes of it: the cap comes before any escaping). ``nm X``: X when it
# is a number, else "-", in N. ``over``: true past the probe's time budget (DL, microseconds since
# the epoch, or SECONDS since the script began where bash has no EPOCHREALTIME; none when empty).
_COMMON = r"""m() { printf '\n@gpubot %s\n' "$*"; }
set -f
LC_ALL=C
TCK=CLK_TCK_VALUE
E1='\134' E2='\040' E3='\012' E4='\011'
rd() { R=; { IFS= read -r -N 8192 R <"$1"; } 2>/dev/null; R=${R%$'\n'}; }
esc() { P=("${1:0:4096}"); esc_all; R="=${P[0]}"; }
# Escapes every element of the caller's array P in place. Text with bytes outside printable ASCII
# (and space, tab, newline) goes through printf %q, which writes them as \ooo in C code, and a few
# substitutions over its ASCII answer turn its $'...' into this format; an answer of any other
# shape (another bash's %q) takes the slow path: one substitution over the text per distinct byte.
# Never a step per byte: 4 KiB of non-ASCII text took 0.6 s a process byte by byte, so 40 such
# processes stalled the probe. Most text needs no escaping at all: one test of all of it says so.
esc_all() {
  local k s q t=$'\t\n' IFS=
  s="${P[*]}"
  [[ $s == *[!\!-~]* || $s == *\\* ]] || return 0
  for k in "${!P[@]}"; do
    s=${P[k]}
    if [[ $s == *[!\ -~"$t"]* ]]; then
      printf -v q '%q' "$s"
      if [[ $q == "\$'"*"'" ]]; then
        q=${q:2:${#q}-3}
        q=${q//'\\'/'\134'}; q=${q//"\\'"/"'"}; q=${q// /'\040'}; q=${q//'\n'/'\012'}
        q=${q//'\t'/'\011'}; q=${q//'\r'/'\015'}; q=${q//'\a'/'\007'}; q=${q//'\b'/'\010'}
        q=${q//'\E'/'\033'}; q=${q//'\e'/'\033'}; q=${q//'\f'/'\014'}; q=${q//'\v'/'\013'}
        s=${q//\\[0-3][0-7][0-7]/}
        [[ $s == *[!\!-~]* || $s == *\\* ]] || { P[k]=$q; continue; }
        s=${P[k]}
      fi
      P[k]=$(esc_slow "$s")
    else
      s=${s//\\/"$E1"}; s=${s// /"$E2"}; s=${s//$'\n'/"$E3"}; P[k]=${s//$'\t'/"$E4"}
    fi
  done
}
esc_slow() {  # $1 escaped, printed: one substitution per distinct byte outside printable ASCII
  local s=$1 j c x
  s=${s//\\/"$E1"}; s=${s// /"$E2"}; s=${s//$'\n'/"$E3"}; s=${s//$'\t'/"$E4"}
  j=$s
  while [[ $j == *[!\!-~]* ]]; do
    x=${j%%[!\!-~]*}; c=${j:${#x}:1}
    printf -v x '\\%03o' "'$c"
    s=${s//"$c"/"$x"}; j=${j//"$c"/}
  done
  printf '%s' "$s"
}
over() {
  [[ -n $DL ]] || return 1
  local t=${EPOCHREALTIME//[!0-9]/}
  [[ -n $t ]] || t=$(( SECONDS * 1000000 ))
  (( 10#$t > DL ))
}
left() {  # seconds left of the budget less $1 ms, in R (an hour without one; at least 0.001)
  local t=${EPOCHREALTIME//[!0-9]/} x
  [[ -n $t ]] || t=$(( SECONDS * 1000000 ))
  x=3600000000; [[ -n $DL ]] && x=$(( DL - 10#$t - ${1:-0} * 1000 ))
  (( x > 1000 )) || x=1000
  printf -v R '%d.%06d' $(( x / 1000000 )) $(( x % 1000000 ))
}
nm() { case $1 in ''|*[!0-9]*) N=- ;; *) N=$1 ;; esac; }
num() { [[ -n $1 && $1 != *[!0-9]* ]]; }  # a number (digits only): a glob, no regex to compile
# A /proc/PID/stat text's fields after its name (which may hold anything but ends at the last
# ")"), in the caller's array F; a /proc/PID/status text's uids (real, effective ...), in U (the
# kernel escapes a newline in Name: no Uid line can be forged).
fields() { local x=${1%')'*}; [[ $x == "$1" ]] || x=${1:${#x}+1}; F=($x); }  # ## would be O(n²)
uid_fields() { local x=${1#*$'\n'Uid:}; U=(); [[ $x == "$1" ]] || U=(${x%%$'\n'*}); }
lines() { local IFS=$'\n'; L=($1); }
""".replace("CLK_TCK_VALUE", str(CLK_TCK))

# One line per process, fields separated by single spaces, escaped text prefixed with "=":
#   c CLK_TCK UPTIME                      (first)
#   p PID STATE PPID START RUID EUID =COMM =CMDLINE =EXE|! =CGROUP =WCHAN
#   g PID                                 (it exited: stat or status could not be read)
#   u UID =NAME|!                         (once for every EUID and user-slice uid seen)
# Every PID argument gets exactly one p or g line, in argument order.
_PROCS = r"""argv_of() {  # /proc/PID/cmdline escaped (each NUL as \000) in R: 64 args, 4096 bytes
  local a n=0 k=0 IFS=
  local -a P=()
  # One argument a read, capped by what is left: the text's size and its NULs are unknown until
  # read (a mapfile of a 6 MiB argv, or a read -N over 6 MiB of NULs, would be a cost any user
  # could give every probe).
  while (( n < 4096 && k < 64 )); do
    read -r -d '' -n $(( 4096 - n )) a || { [[ -n $a ]] && P[k]=$a; break; }
    P[k++]=$a; (( n += ${#a} + 1 ))
  done 2>/dev/null <"$1"
  R==
  (( ${#P[@]} )) || return 0
  esc_all
  printf -v R '%s\\000' "${P[@]}"; R="=$R"
}
slice_uid() {  # a rootless container's owner: the user-U.slice at the top of a cgroup path
  local l re='^[0-9]+:[^:]*:/user\.slice/user-([0-9]+)\.slice/user@[0-9]+\.service/'
  local -a L
  lines "$1"
  for l in "${L[@]}"; do
    [[ $l =~ $re ]] || continue
    [[ $uids == *" ${BASH_REMATCH[1]} "* ]] || uids+="${BASH_REMATCH[1]} "
    return 0
  done
}
procs() {
  local seen=' ' list= p d st sts x up cm cmd ex cg wc e ru eu uids=' ' name u
  local -a F U P
  for p in "$@"; do
    case $p in ''|*[!0-9]*) continue ;; esac
    case $seen in *" $p "*) continue ;; esac
    seen+="$p " list+=" $p"
  done
  m procs
  # No process to read (idle GPUs): no /proc work at all.
  [[ -n $list ]] || { printf 'c - -\n'; return 0; }
  up=; { read -r up _ </proc/uptime; } 2>/dev/null
  [[ $up =~ ^[0-9]+(\.[0-9]+)?$ ]] || up=-
  printf 'c %s %s\n' "$TCK" "$up"
  for p in $list; do
    over && { m over "$B" procs; m end; exit 0; }
    d=/proc/$p
    rd "$d/stat"; st=$R
    rd "$d/status"; sts=$R
    if [[ -z $st || -z $sts || $st != *'('*')'* ]]; then printf 'g %s\n' "$p"; continue; fi
    fields "$st"
    (( ${#F[@]} >= 20 )) || { printf 'g %s\n' "$p"; continue; }
    uid_fields "$sts"; ru=${U[0]:--} eu=${U[1]:--}
    cm=${st#*'('}; cm=${cm%')'*}
    argv_of "$d/cmdline"; cmd=$R
    ex='!'
    if [[ $ru == "$eu" ]] && num "$eu" && (( eu < 1000 )); then
      # Only a system account can own a protected daemon: read its exe (where permitted) and
      # spare every user job a readlink.
      e=$(readlink "$d/exe" 2>/dev/null) && [[ -n $e ]] && { esc "$e"; ex=$R; }
    fi
    rd "$d/cgroup"
    # Only root makes user-U.slice/user@U.service: its uid is named too (a rootless container's
    # processes run as subordinate uids that no one is called).
    [[ $R == *'/user.slice/user-'* ]] && slice_uid "$R"
    esc "$R"; cg=$R
    rd "$d/wchan"; esc "$R"; wc=$R
    esc "$cm"; cm=$R
    x=${F[0]}; [[ $x == [A-Za-z] ]] || x=-
    nm "${F[1]}"; printf 'p %s %s %s' "$p" "$x" "$N"
    nm "${F[19]}"; printf ' %s' "$N"
    nm "$ru"; printf ' %s' "$N"
    nm "$eu"; printf ' %s %s %s %s %s %s\n' "$N" "$cm" "$cmd" "$ex" "$cg" "$wc"
    [[ $N != - && $uids != *" $N "* ]] && uids+="$N "
  done
  [[ $uids == ' ' ]] && return 0
  # Names: local accounts from /etc/passwd; NSS (getent) only for the rest (LDAP, SSSD).
  while IFS=: read -r name _ u _; do
    [[ $uids == *" $u "* ]] || continue
    esc "$name"; printf 'u %s %s\n' "$u" "$R"; uids=${uids/ $u / }
    [[ $uids == ' ' ]] && break
  done 2>/dev/null </etc/passwd
  # NSS may be a network round trip per uid, and a user with subuid ranges can hold device files
  # under as many unlisted uids as they like: at most 16 are asked, each answer read within what
  # is left of the budget; the rest stay unnamed ("!").
  if [[ $uids != ' ' ]] && ! over; then
    local ask= k=0 tl
    for u in $uids; do (( k++ < 16 )) && ask+=" $u"; done
    left 0; tl=$R
    while IFS=: read -r -t "$tl" name _ u _; do
      [[ $uids == *" $u "* ]] || continue
      esc "$name"; printf 'u %s %s\n' "$u" "$R"; uids=${uids/ $u / }
      over && break
      left 0; tl=$R
    done < <(getent passwd $ask 2>/dev/null)
  fi
  for u in $uids; do printf 'u %s !\n' "$u"; done
}
"""

# Numeric first CSV fields of each line of $1 (GPU indices, PIDs), space separated, in R.
_FIRSTS = r"""firsts() {
  local f o=
  lines "$1"
  for f in "${L[@]}"; do
    f=${f%%,*}
    case $f in ''|*[!0-9]*) ;; *) o+="$f " ;; esac
  done
  R=$o
}
"""

# Runs an nvidia-smi query for at most $T seconds: its output in Q, its exit status in S; like
# timeout(1), 124 when the time ran out (then TERM, and KILL a second later). A copy stuck in the
# kernel cannot die: it is left behind, never waited for, and the next probe finds it (below).
# The query's subshell appends its exit status to the output (bash's record of a process
# substitution's status can be lost when it exits at once). The job writes its PID first, then
# execs; it is signalled only while still that process (no PID reuse), and directly, never
# through a trap (a signal ignored when bash started, as under nohup, cannot be trapped).
_QUERY = r"""started() {  # the start time of process $1, in R (empty when it is gone)
  local -a F
  rd "/proc/$1/stat"; [[ $R == *')'* ]] && fields "$R"; R=${F[19]}
}
signal() {  # signal $1 to process $2 if it is still the one that started at $3
  started "$2"; [[ -n $3 && $R == "$3" ]] && kill "-$1" "$2" 2>/dev/null
}
query() {
  local fd c= t= r
  Q=
  exec {fd}< <(
    { [[ $1 == "$smi" ]] && rec "$BASHPID"; printf '%s\n' "$BASHPID"; exec "$@" 2>&"${QE:-4}"; } &
    wait "$!"
    printf '\n@rc %s' "$?"
  )
  IFS= read -r -t "$T" -u "$fd" c
  r=142
  if num "$c"; then
    started "$c"; t=$R
    IFS= read -r -N 8388608 -t "$T" -u "$fd" Q; r=$?  # -N: in blocks, not a byte a call
  fi
  if (( r > 128 )); then
    signal TERM "$c" "$t"
    IFS= read -r -N 8388608 -t 1 -u "$fd" _
    signal KILL "$c" "$t"
    exec {fd}<&-
    S=124
    return 0
  fi
  exec {fd}<&-
  S=${Q##*$'\n'@rc }
  Q=${Q%$'\n'@rc *}
}
"""

# fuser -v: the table goes out without its COMMAND column (the process's own say: read from
# /proc, escaped); the PIDs of a GPU's device file collect in FP for the /proc read. A holder of
# only {prefix}ctl or {prefix}-uvm is counted, never read, so any number of them costs nothing.
# Without root fuser cannot look into other users' processes: count them (PID 1 aside), never
# drop them.
_FUSER = r"""fuser_table() {
  local line o i q blind=' ' nb=0 ctl=0
  local -a F
  FP=
  lines "$1"
  for line in "${L[@]}"; do
    over && { m over "$B" fuser; m end; exit 0; }
    case $line in
      'Cannot stat file /proc/'[0-9]*/*)
        q=${line#'Cannot stat file /proc/'}; q=${q%%/*}
        [[ $q != 1 && $blind != *" $q "* ]] && { blind+="$q "; (( nb += 1 )); }
        continue ;;
      'Cannot stat '*|'Specified filename '*) continue ;;
    esac
    F=($line)
    [[ ${F[0]} == USER && ${F[1]} == PID && ${F[2]} == ACCESS ]] && continue
    if [[ $line != ' '* ]]; then  # a file's first row: which file the rows below are about
      ctl=0; [[ $line == "${pre}ctl:"* || $line == "${pre}-uvm:"* ]] && ctl=1
    fi
    for (( i = 1; i < ${#F[@]}; i++ )); do
      [[ ${F[i]} == [.cefFrmM][.cefFrmM][.cefFrmM][.cefFrmM][.cefFrmM] ]] && num "${F[i-1]}" \
        && break
    done
    if (( i >= ${#F[@]} )); then printf '%s\n' "$line"; continue; fi
    o=${F[0]}; [[ $line == ' '* ]] && o="  $o"
    o+=" ${F[*]:1:i}"
    printf '%s\n' "$o"
    (( ctl )) || FP+=" ${F[i-1]}"
  done
  (( nb )) && printf '~unseen %s\n' "$nb"
  return 0
}
"""


def _args(argv: list[str]) -> str:
    # The queries are constants (bash arrays GQ and AQ); only "$smi" and "$idx" vary, quoted.
    return " ".join(argv[1:])


PROBE_SCRIPT = (
    _COMMON
    + _PROCS
    + _FIRSTS
    + _QUERY
    + STUCK
    + ADDS_UP
    + _FUSER
    + WATCHDOG
    + r"""smi=$1 pre=$2 T=$3 sudo=$4 mode=$5 idx=$6 drv=$7 mins=$8 B=$9 hold=${10} SD=${11}
shift 11
extra=$* ng=
# The time budget (B ms): past it the probe writes "over" and stops; the parser takes the rest
# of the node's answer for unknown, never for a timeout or for "no holders".
t=${EPOCHREALTIME//[!0-9]/}; [[ -n $t ]] || t=$(( SECONDS * 1000000 ))
DL=; [[ $B =~ ^[0-9]+$ ]] && DL=$(( 10#$t + 10#$B * 1000 ))
GQ=(GPU_Q)
AQ=(APPS_Q)
watchdog &
wd=$!
trap 'kill -KILL "$wd" 2>/dev/null' EXIT
exec 4>&1
PATH=$PATH:/usr/sbin:/sbin  # fuser lives in sbin on some distributions
m probe "$T" "${idx:--}"
if (( BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] < 404 )); then m fatal old-bash; m end; exit 0; fi
need() { command -v "$1" >/dev/null 2>&1 || { m fatal "no-$1"; m end; exit 0; }; }
if [[ $sudo == sudo ]]; then need sudo; else need fuser; fi
rd /proc/$$/status; uid_fields "$R"; me=${U[1]}  # the effective uid
# The queries' records (probe_guards): in the login account's own runtime folder, or none.
[[ $SD == - ]] && SD=/run/user/$me
[[ -n $me && -d $SD && -O $SD && ! -L $SD && -w $SD ]] || SD=
if [[ $mode == smi ]]; then
  stuck_smi
  if [[ -n $R ]]; then m stuck; printf '%s' "$R"; m end; exit 0; fi
  m gpus-err
  if [[ -n $idx ]]; then query "$smi" "${GQ[@]}" -i "$idx"; else query "$smi" "${GQ[@]}"; fi
  m gpus "$S"; printf '%s\n' "$Q"
  case $S in 0|14|15) ;; *) m end; exit 0 ;; esac  # 14: infoROM warning, 15: a GPU lost
  g=$Q gs=$S
  [[ -n $idx ]] || { firsts "$g"; idx=$R; }
  m apps-err
  query "$smi" "${AQ[@]}"
  m apps "$S"; printf '%s\n' "$Q"
  case $S in 0|14|15) ;; *) m end; exit 0 ;; esac
  firsts "$Q"; extra+=" $R"
  # A status (hold=auto) asks fuser only where nvidia-smi's apps leave memory unexplained.
  [[ $hold == auto && $gs == 0 && $S == 0 ]] && adds_up "$g" "$Q" && ng=-
fi
# Each GPU's device minor, as the driver says: a GPU's index is not its minor.
m minors
set +f; gdirs=("$drv"/gpus/*); set -f
for d in "${gdirs[@]}"; do
  [[ -r $d/information ]] || continue
  mi=-
  while IFS=: read -r k v; do
    if [[ $k == 'Device Minor' ]]; then v=($v); mi=${v[0]:--}; fi
  done 2>/dev/null <"$d/information"
  printf '%s %s\n' "${d##*/}" "$mi"
  mins+=",$mi"
done
files=()
seen=,
IFS=', '
for i in $mins; do
  case $i in ''|*[!0-9]*) continue ;; esac
  case $seen in *",$i,"*) continue ;; esac
  seen+="$i,"
  [[ -e $pre$i ]] && files+=("$pre$i")
done
IFS=$' \t\n'
[[ $ng == - ]] || ng=${#files[@]}  # no GPU device file: nothing to ask fuser (sudoers rule)
for f in "${pre}ctl" "${pre}-uvm"; do [[ -e $f ]] && files+=("$f"); done
if [[ $ng == - ]]; then
  f= s=-  # not asked: the parser notes it
elif (( ng > 0 )); then
  # fuser reads every process's open files: it runs for what is left of the budget, at most
  # (a query, its errors merged into its answer); past it, the node's answer is unknown.
  left  # out of time: TERM (fuser dies at once), the "over" marker within the transport's limit
  if [[ $sudo == sudo ]]; then QE=1 T=$R query sudo -n fuser -v "${files[@]}"; else
    QE=1 T=$R query fuser -v "${files[@]}"; fi
  (( S == 124 )) && { m over "$B" fuser; m end; exit 0; }
  f=$Q s=$S
else
  f= s=1
fi
m fuser "$s"
fuser_table "$f"
# /proc mounted with hidepid: other users' processes are not there to read.
# One read of the table, not a read a line (users' FUSE mounts are lines of it too).
hp=-
L=(); { mapfile -t L </proc/mounts; } 2>/dev/null
for line in "${L[@]}"; do
  [[ $line == *' /proc proc '* ]] || continue
  F=($line)
  [[ ${F[1]} == /proc && ${F[2]} == proc ]] || continue
  case ,${F[3]}, in *,hidepid=*) hp=${F[3]#*hidepid=}; hp=${hp%%,*} ;; esac
done
m view "$hp" "${me:--}"
procs $extra $FP
m end
""".replace("GPU_Q", _args(gpu_query_argv("nvidia-smi"))).replace(
        "APPS_Q", _args(apps_query_argv("nvidia-smi"))
    )
)

PROC_SCRIPT = (
    _COMMON
    + _PROCS
    + """procs "$@"
m end
"""
)
