#!/usr/bin/env bash
# The package end to end, as an operator and a tenant meet it (docs/install.md,
# docs/tenants.md): builds the .deb from CI's debug build, installs it with dpkg -i,
# checks the unit with systemd-analyze verify, starts vgpud exactly as the unit's ExecStart
# does with the shipped configuration (directly: CI has no running systemd), launches a VM
# with a vGPU, runs a C program through the installed CUDA library on a process vGPU (twice
# back to back), then removes the package: dpkg -r keeps only the configuration and the
# state, dpkg -P leaves nothing.
#
# Needs root and dpkg (skips, saying so, without them); /dev/kvm for the VM and a C
# compiler for the C program (each skipped, saying so, where absent). Refuses to run
# where a vgpu package is already installed.
#
# Usage: ci/package-test.sh      (PROFILE=release to package the release build instead)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
say() { echo "package-test: $*"; }
fail() { echo "package-test: FAIL: $*" >&2; exit 1; }

if [[ $(id -u) -ne 0 ]]; then say "skipped: dpkg -i needs root"; exit 0; fi
if ! command -v dpkg >/dev/null; then say "skipped: no dpkg on this machine"; exit 0; fi
if dpkg-query -W -f='${Status}' vgpu 2>/dev/null | grep -q installed; then
    fail "a vgpu package is already installed here; this test installs and purges its own (dpkg -P vgpu first)"
fi
if [[ -e /run/vgpud/vgpud.sock || -e /var/lib/vgpud ]]; then
    fail "/run/vgpud/vgpud.sock or /var/lib/vgpud exists: another vgpud uses the package's paths here"
fi

deb=$(./ci/package-deb.sh --profile "${PROFILE:-debug}" | tail -1)
work="$(mktemp -d)"
vgpud_pid=""
cleanup() {
    set +e
    if [[ -n "$vgpud_pid" ]] && kill -0 "$vgpud_pid" 2>/dev/null; then
        kill "$vgpud_pid"; wait "$vgpud_pid" 2>/dev/null
    fi
    # VMs and workers outlive vgpud by design; the ones this test started run the
    # installed programs (nothing else may: the package was not installed before).
    for p in /proc/[0-9]*; do
        case "$(readlink "$p/exe" 2>/dev/null)" in
            /usr/bin/vmm|/usr/bin/vmm\ \(deleted\)|/usr/bin/vgpu-worker|/usr/bin/vgpu-worker\ \(deleted\))
                kill -9 "${p#/proc/}" 2>/dev/null ;;
        esac
    done
    if dpkg-query -W vgpu >/dev/null 2>&1; then dpkg -P vgpu >/dev/null 2>&1; fi
    rm -rf "$work"
}
trap cleanup EXIT

say "dpkg -i $(basename "$deb")"
dpkg -i "$deb" >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log"; fail "dpkg -i"; }
for f in /usr/bin/vgpud /usr/bin/vgpu-worker /usr/bin/vmm /usr/bin/vgpuctl /usr/bin/vgpu-cuda \
    /usr/lib/vgpu/cuda/libcuda.so.1 /usr/lib/vgpu/cuda/libcuda.so \
    /usr/lib/vgpu/cuda/libnvidia-ml.so.1 /usr/lib/vgpu/cuda/libnvidia-ml.so /usr/lib/vgpu/payloads/vecadd \
    /usr/lib/systemd/system/vgpud.service /etc/vgpud/vgpud.json; do
    [[ -e "$f" ]] || fail "$f was not installed"
done
[[ -d /var/lib/vgpud ]] || fail "the package did not create /var/lib/vgpud"
if ldconfig -p | grep -q '/usr/lib/vgpu/cuda'; then
    fail "the vGPU CUDA library is on the host's default library path"
fi

unit=/usr/lib/systemd/system/vgpud.service
if command -v systemd-analyze >/dev/null; then
    out=$(systemd-analyze verify "$unit" 2>&1) || { echo "$out"; fail "systemd-analyze verify $unit"; }
    [[ -z "$out" ]] || { echo "$out"; fail "systemd-analyze verify $unit printed warnings"; }
    say "systemd-analyze verify: clean"
else
    say "skipped: systemd-analyze verify (no systemd-analyze on this machine)"
fi
grep -qx 'KillMode=process' "$unit" || fail "the unit would kill VMs and workers on a stop"
# Settings that would close /dev/kvm and /dev/nvidia* to vgpud (ProtectClock= implies a
# DeviceAllow= list).
if grep -E '^(ProtectClock|PrivateDevices|DeviceAllow|DevicePolicy)=' "$unit"; then
    fail "the unit restricts devices vgpud and its workers need"
fi

# The unit's own command line and directories (RuntimeDirectory=, StateDirectory=).
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
[[ -n "$exec_start" ]] || fail "no ExecStart in $unit"
install -d -m 0700 /run/vgpud
say "starting: $exec_start"
read -r -a argv <<<"$exec_start"
env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin RUST_LOG=info "${argv[@]}" 2>"$work/vgpud.log" &
vgpud_pid=$!
for _ in $(seq 100); do
    [[ -S /run/vgpud/vgpud.sock ]] && break
    kill -0 "$vgpud_pid" 2>/dev/null || { cat "$work/vgpud.log"; fail "vgpud exited at start"; }
    sleep 0.1
done
[[ -S /run/vgpud/vgpud.sock ]] || { cat "$work/vgpud.log"; fail "vgpud never served /run/vgpud/vgpud.sock"; }
ctl() { env -i PATH=/usr/bin:/bin vgpuctl "$@"; }
ctl gpus >/dev/null || fail "vgpuctl (no --socket) does not reach the service's vgpud"
ctl payload list | grep -q vecadd || fail "the shipped payloads are not listed"

if [[ -r /dev/kvm && -w /dev/kvm ]]; then
    say "a VM with a vGPU"
    out=$(ctl vm launch --payload vecadd --memory 256M --compute 0.5 --wait 2>&1) \
        || { echo "$out"; cat "$work/vgpud.log"; fail "the VM did not exit 0"; }
    say "VM exited 0"
else
    say "skipped: the VM (no usable /dev/kvm)"
fi

cc=${CC:-cc}
if command -v "$cc" >/dev/null; then
    say "a C program through /usr/lib/vgpu/cuda on a process vGPU"
    json=$(ctl --json vgpu create --attach process --memory 256M --compute 0.5)
    id=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])' <<<"$json")
    socket=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["socket"])' <<<"$json")
    "$cc" -std=c11 -Wall -Werror -I /usr/lib/vgpu/cuda/include cuda-shim/tests/c/smoke.c \
        -o "$work/smoke" -L /usr/lib/vgpu/cuda -lcuda
    for run in 1 2; do
        out=$(env -i VGPU_SOCKET="$socket" LD_LIBRARY_PATH=/usr/lib/vgpu/cuda "$work/smoke" 2>&1) \
            || { echo "$out"; fail "the C program, run $run"; }
        [[ "$out" == ok ]] || { echo "$out"; fail "the C program printed something else, run $run"; }
    done
    say "the C program ran twice"
    ctl vgpu delete "$id" >/dev/null
else
    say "skipped: the C program (no C compiler $cc)"
fi
ctl vm list --json | python3 -c 'import json,sys; [print(v["id"]) for v in json.load(sys.stdin)]' \
    | while read -r vm; do ctl vm delete "$vm" >/dev/null 2>&1 || true; done

kill "$vgpud_pid"; wait "$vgpud_pid" 2>/dev/null || true
vgpud_pid=""
grep -q '"level":"INFO"' "$work/vgpud.log" || { cat "$work/vgpud.log"; fail "vgpud's log is not JSON"; }
if grep -q '":"None"' "$work/vgpud.log"; then grep '":"None"' "$work/vgpud.log"; fail "the JSON log has None values"; fi

say "dpkg -r vgpu"
dpkg -r vgpu >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log"; fail "dpkg -r"; }
for f in /usr/bin/vgpud /usr/bin/vgpuctl /usr/lib/vgpu /usr/lib/systemd/system/vgpud.service /usr/share/doc/vgpu; do
    [[ ! -e "$f" ]] || fail "dpkg -r left $f"
done
[[ -f /etc/vgpud/vgpud.json ]] || fail "dpkg -r removed the configuration (only purge does)"
say "dpkg -P vgpu"
dpkg -P vgpu >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log"; fail "dpkg -P"; }
for f in /etc/vgpud /var/lib/vgpud /run/vgpud /usr/lib/vgpu; do
    [[ ! -e "$f" ]] || fail "dpkg -P left $f"
done
! dpkg-query -W vgpu >/dev/null 2>&1 || fail "dpkg still knows the package"
say "passed"
