"""The node probe's remote scripts: constant POSIX ``sh`` (dash-compatible) with ``awk``.

Everything that varies (the nvidia-smi command, the device prefix, GPU indices, PIDs) arrives as
positional arguments, so no text from a person or a node ever reaches a shell unquoted. There is no
per-call secret: anyone on the node can read these arguments in ``/proc/PID/cmdline``.

Framing without a secret: every byte a process controls about itself (comm, argv, exe path, cgroup)
is read by ``awk`` and written escaped: printable ASCII except space and backslash stays, every
other byte becomes ``\\ooo`` (octal). Such text can never hold a newline, so it can never start a
line, and every section marker (``@gpubot KIND ARGS`` on a line of its own) comes from the script.
The other bodies are the output of trusted programs: nvidia-smi's GPU and compute-app tables
(without ``process_name``), and fuser's table with its COMMAND column cut off.
"""

from __future__ import annotations

from gpubot.core.nvsmi import apps_query_argv, gpu_query_argv

MARK = "@gpubot"

# Prints a section marker; every marker starts on a fresh line (output may lack a final newline).
_MARK = """m() { printf '\\n@gpubot %s\\n' "$*"; }
set -f
"""

# One line per process, fields separated by single spaces, escaped text prefixed with "=":
#   c CLK_TCK UPTIME                      (first)
#   p PID STATE PPID START RUID EUID =COMM =CMDLINE =EXE|! =CGROUP =WCHAN
#   g PID                                 (it exited: stat or status could not be read)
#   u UID =NAME|!                         (getent passwd, once for every EUID seen)
# Every PID argument gets exactly one p or g line, in argument order.
_AWK_PROCS = r"""
function rd(f,   s, l, n, r) {
  s = ""; n = 0
  while ((r = (getline l < f)) > 0) { s = (n++ ? s "\n" : "") l; if (length(s) > 4096) break }
  close(f)
  RD = (r >= 0 || n > 0)
  return s
}
function esc(s,   o, i, c, n) {
  o = "="; n = length(s); if (n > 4096) n = 4096
  for (i = 1; i <= n; i++) {
    c = substr(s, i, 1)
    if (c in ok) o = o c; else o = o sprintf("\\%03o", (c in ord) ? ord[c] : 0)
  }
  return o
}
function num(s) { return (s ~ /^[0-9]+$/) ? s : "-" }
BEGIN {
  for (i = 0; i < 256; i++) ord[sprintf("%c", i)] = i
  for (i = 33; i < 127; i++) if (i != 92) ok[sprintf("%c", i)] = 1
  split(rd("/proc/uptime"), up, " ")
  print "c", num(ARGV[1]), ((up[1] ~ /^[0-9]+(\.[0-9]+)?$/) ? up[1] : "-")
  for (a = 2; a < ARGC; a++) {
    p = ARGV[a]; d = "/proc/" p
    st = rd(d "/stat"); if (!RD || st == "") { print "g", p; continue }
    sts = rd(d "/status"); if (!RD) { print "g", p; continue }
    ru = eu = "-"
    n = split(sts, L, "\n")
    for (i = 1; i <= n; i++) if (L[i] ~ /^Uid:/) { split(L[i], f, /[ \t]+/); ru = f[2]; eu = f[3] }
    l = index(st, "("); r = 0
    for (i = length(st); i > l; i--) if (substr(st, i, 1) == ")") { r = i; break }
    k = (l && r) ? split(substr(st, r + 1), F, " ") : 0
    if (k < 20) { print "g", p; continue }
    cm = rd(d "/cmdline")
    ex = "!"
    if (ru == eu && eu ~ /^[0-9]+$/ && eu + 0 < 1000) {
      # Only a system account can own a protected daemon: read its exe (where permitted) and
      # spare every user job a readlink.
      x = "readlink /proc/" p "/exe 2>/dev/null"; e = ""; ne = 0
      while ((x | getline xl) > 0) e = (ne++ ? e "\n" : "") xl
      close(x)
      if (ne) ex = esc(e)
    }
    cg = rd(d "/cgroup")
    wc = rd(d "/wchan")
    sl = (F[1] ~ /^[A-Za-z]$/) ? F[1] : "-"
    printf "p %s %s %s %s %s %s %s %s %s %s %s\n", p, sl, num(F[2]), num(F[20]), num(ru), num(eu),
      esc(substr(st, l + 1, r - l - 1)), esc(cm), ex, esc(cg), esc(wc)
    if (eu ~ /^[0-9]+$/) uids[eu] = 1
  }
  cmd = "getent passwd"; any = 0
  for (u in uids) { cmd = cmd " " u; any = 1 }
  if (any) {
    while ((cmd | getline l) > 0) {
      n = split(l, f, ":")
      if (n < 3 || !(f[3] in uids) || uids[f[3]] != 1) continue
      print "u", f[3], esc(f[1]); uids[f[3]] = 2
    }
    close(cmd)
  }
  for (u in uids) if (uids[u] == 1) print "u", u, "!"
}
"""

# /proc for each PID argument (digits only, each once).
_PROCS = (
    """procs() {
  seen=' ' list=
  for p in "$@"; do
    case $p in ''|*[!0-9]*) continue ;; esac
    case $seen in *" $p "*) continue ;; esac
    seen="$seen$p " list="$list $p"
  done
  m procs
  # No process to read (idle GPUs): no awk, no clock.
  [ -n "$list" ] || { printf 'c - -\n'; return 0; }
  LC_ALL=C awk '"""
    + _AWK_PROCS
    + """' "$(getconf CLK_TCK 2>/dev/null)" $list
}
"""
)

# Numeric first CSV fields of each line of $1 (GPU indices, PIDs), space separated.
_FIRSTS = """firsts() {
  printf '%s\\n' "$1" | while IFS=, read -r f _; do
    case $f in ''|*[!0-9]*) ;; *) printf '%s ' "$f" ;; esac
  done
}
"""

# fuser -v: the PIDs (the field before ACCESS) go to stderr for the /proc read; the table goes
# out without its COMMAND column (the process's own name: read from /proc instead, escaped).
_AWK_FUSER = r"""
# Without root, fuser cannot look into the processes of other users: count them (PID 1 aside,
# which a container root cannot look into either, and which holds no GPU), never drop them.
/^Cannot stat file \/proc\/[0-9]+\// {
  split($4, q, "/"); if (q[3] != "1" && !(q[3] in blind)) { blind[q[3]] = 1; nb++ }
  next
}
/^Cannot stat / || /^Specified filename / { next }
$1 == "USER" && $2 == "PID" && $3 == "ACCESS" { next }
{
  for (i = 2; i <= NF; i++)
    if ($i ~ /^[.cefFrmM][.cefFrmM][.cefFrmM][.cefFrmM][.cefFrmM]$/ && $(i - 1) ~ /^[0-9]+$/) break
  if (i > NF) { print; next }
  o = (substr($0, 1, 1) == " ") ? "  " $1 : $1
  for (j = 2; j <= i; j++) o = o " " $j
  print o
  printf "%s ", $(i - 1) > "/dev/stderr"
}
END { if (nb) print "~unseen", nb }
"""


def _smi(argv: list[str]) -> str:
    # The queries are constants; only "$smi" (and -i "$idx") vary and are quoted.
    return '"$smi" ' + " ".join(argv[1:])


PROBE_SCRIPT = (
    _MARK
    + _PROCS
    + _FIRSTS
    + """smi=$1 pre=$2 T=$3 sudo=$4 mode=$5 idx=$6 drv=$7 mins=$8
shift 8
extra=$*
exec 4>&1
PATH=$PATH:/usr/sbin:/sbin  # fuser lives in sbin on some distributions
m probe "$T" "${idx:--}"
need() { command -v "$1" >/dev/null 2>&1 || { m fatal "no-$1"; m end; exit 0; }; }
if [ "$sudo" = sudo ]; then need sudo; else need fuser; fi
me=; while read -r k _ eu _; do [ "$k" = Uid: ] && { me=$eu; break; }; done </proc/$$/status
if [ "$mode" = smi ]; then
  need timeout
  # A hung driver leaves nvidia-smi in the kernel (state D), where timeout cannot kill it: each
  # new query would leave one more. One of ours stuck, or older than our own limit: ask nothing.
  lim=$(( 2 * ${T%%.*} + 2 )) tck= up= stuck=
  for p in $(pgrep -x nvidia-smi 2>/dev/null); do
    case $p in ''|*[!0-9]*) continue ;; esac
    s=; { read -r s; } 2>/dev/null <"/proc/$p/stat"
    u=; while read -r k _ eu _; do [ "$k" = Uid: ] && { u=$eu; break; }; done 2>/dev/null \
      <"/proc/$p/status"
    [ -n "$s" ] && [ -n "$u" ] && [ "$u" = "$me" ] || continue
    # ours, started as this probe starts it: "$smi" is one of its arguments (argv[0], or the
    # script's path after its interpreter)
    tr '\\0' '\\n' <"/proc/$p/cmdline" 2>/dev/null | grep -qxF -- "$smi" || continue
    set -- ${s##*)}
    st=$1; shift 19; start=$1
    [ -n "$tck" ] || { tck=$(getconf CLK_TCK 2>/dev/null); read -r up _ </proc/uptime; }
    age=$(( ${up%%.*} - start / ${tck:-100} ))
    case $st in Z|X) continue ;; esac
    if [ "$st" = D ] || [ "$age" -gt "$lim" ]; then stuck="$stuck$p $st $age
"; fi
  done
  if [ -n "$stuck" ]; then m stuck; printf '%s' "$stuck"; m end; exit 0; fi
  m gpus-err
  if [ -n "$idx" ]; then
    g=$(timeout -k 1 "$T" GPU_Q -i "$idx" 2>&4)
  else
    g=$(timeout -k 1 "$T" GPU_Q 2>&4)
  fi
  s=$?
  m gpus "$s"; printf '%s\\n' "$g"
  case $s in 0|14|15) ;; *) m end; exit 0 ;; esac  # 14: infoROM warning, 15: a GPU lost
  [ -n "$idx" ] || idx=$(firsts "$g")
  m apps-err
  a=$(timeout -k 1 "$T" APPS_Q 2>&4)
  s=$?
  m apps "$s"; printf '%s\\n' "$a"
  case $s in 0|14|15) ;; *) m end; exit 0 ;; esac
  extra="$extra $(firsts "$a")"
fi
# Each GPU's device minor, as the driver says: a GPU's index is not its minor.
m minors
set +f
for d in "$drv"/gpus/*; do
  [ -r "$d/information" ] || continue
  mi=-
  while IFS=: read -r k v; do
    if [ "$k" = "Device Minor" ]; then set -f; set -- $v; mi=${1:--}; set +f; fi
  done 2>/dev/null <"$d/information"
  printf '%s %s\n' "${d##*/}" "$mi"
  mins="$mins,$mi"
done
set -f
set --
seen=,
IFS=', '
for i in $mins; do
  case $i in ''|*[!0-9]*) continue ;; esac
  case $seen in *",$i,"*) continue ;; esac
  seen="$seen$i,"
  [ -e "$pre$i" ] && set -- "$@" "$pre$i"
done
IFS=' '
ng=$#  # no GPU device file: nothing to ask fuser (the sudoers rule wants one first)
for f in "${pre}ctl" "${pre}-uvm"; do [ -e "$f" ] && set -- "$@" "$f"; done
if [ "$ng" -gt 0 ]; then
  if [ "$sudo" = sudo ]; then f=$(sudo -n fuser -v "$@" 2>&1); else f=$(fuser -v "$@" 2>&1); fi
  s=$?
else
  f= s=1
fi
m fuser "$s"
fp=$(printf '%s\\n' "$f" | LC_ALL=C awk 'AWK_FUSER' 2>&1 >&4)
# /proc mounted with hidepid: other users' processes are not there to read.
hp=-
while read -r _ mnt fs opts _; do
  [ "$mnt" = /proc ] && [ "$fs" = proc ] || continue
  case ,$opts, in *,hidepid=*) hp=${opts#*hidepid=}; hp=${hp%%,*} ;; esac
done 2>/dev/null </proc/mounts
m view "$hp" "${me:--}"
procs $extra $fp
m end
""".replace("GPU_Q", _smi(gpu_query_argv("nvidia-smi")))
    .replace("APPS_Q", _smi(apps_query_argv("nvidia-smi")))
    .replace("AWK_FUSER", _AWK_FUSER)
)

PROC_SCRIPT = (
    _MARK
    + _PROCS
    + """procs "$@"
m end
"""
)
