//! The payload guests (`guests/payloads`) and their arguments: one table that vgpud's
//! `GET /v1/payloads`, `vgpuctl payload list` and docs/payloads.md share.
//!
//! A payload's argument string (`payload_arg`, `vgpuctl vm launch --arg`) is a list of
//! space-separated `key=value` words and flags, at most 4096 bytes (docs/payload-abi.md).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One argument a payload takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArgInfo {
    /// The word as given, e.g. `rounds=<n>` or `reset`.
    pub name: &'static str,
    /// Its default, when it has one.
    pub default: Option<&'static str>,
    /// What it does.
    pub what: &'static str,
}

/// One payload guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PayloadInfo {
    /// Its file name in the payload directory (`cargo run -p payload-build -- --out DIR`).
    pub name: &'static str,
    /// What it does, one sentence.
    pub summary: &'static str,
    /// Its arguments.
    pub args: &'static [ArgInfo],
    /// What it prints at the end and how it exits.
    pub result: &'static str,
}

const fn arg(name: &'static str, default: Option<&'static str>, what: &'static str) -> ArgInfo {
    ArgInfo {
        name,
        default,
        what,
    }
}

/// Every payload guest, by name.
pub const PAYLOADS: &[PayloadInfo] = &[
    PayloadInfo {
        name: "gpu-load",
        summary: "A long-running vGPU workload that checks its own results: each round uploads x, runs saxpy and a spin burst, and every few rounds compares a device checksum with the expected one.",
        args: &[
            arg("rounds=<n>", Some("100"), "rounds to run"),
            arg("n=<elements>", Some("16384"), "elements of x and y"),
            arg("spin_us=<µs>", Some("10000"), "compute burst per round"),
            arg("check=<k>", Some("10"), "check the checksum every k rounds"),
            arg("retry=<k>", Some("0"), "send a request answered DEVICE_ERROR or OUT_OF_MEMORY again, up to k times (0: a failed request ends the run)"),
        ],
        result: "`GPU-LOAD OK rounds=<n> checksum=0x...`, exit 0; 2 bad argument, 3 no vGPU, 4 driver/device error, 6 checksum mismatch",
    },
    PayloadInfo {
        name: "hello",
        summary: "Smoke payload: proves the vmm's entry state, boot info, console and exit paths (no vGPU needed).",
        args: &[
            arg("exit=<n>", Some("0"), "exit with code n"),
            arg("reset", None, "leave through the i8042 reset (the vmm exits 0)"),
            arg("panic", None, "panic (the runtime prints the message and exits 101)"),
        ],
        result: "a greeting and `aps=<n>` with several vCPUs; the exit code asked for",
    },
    PayloadInfo {
        name: "hostile",
        summary: "A guest that gets everything wrong on purpose (malformed requests, foreign addresses, faulting kernels) and checks that each gets its documented error and the queue keeps working.",
        args: &[],
        result: "one `hostile: <case>: <outcome>` line per case and `HOSTILE OK`, exit 0; non-zero at the first deviation",
    },
    PayloadInfo {
        name: "kvm-exits",
        summary: "Benchmark anchor: the cost of one guest exit to the vmm and back (no vGPU needed).",
        args: &[arg("n=<count>", Some("100000"), "exits to time (a bare number works too)")],
        result: "the time per exit, exit 0",
    },
    PayloadInfo {
        name: "memcheck",
        summary: "Device memory integrity under oversubscription: fills buffers with a unique pattern and checks every byte across many evictions.",
        args: &[
            arg("buffers=<k>", Some("4"), "allocations"),
            arg("size_mib=<m>", Some("8"), "MiB each"),
            arg("rounds=<r>", Some("3"), "times every buffer is checked and rewritten"),
            arg("seed=<s>", Some("1"), "pattern seed"),
            arg("pause_ms=<ms>", Some("0"), "pause between rounds"),
        ],
        result: "`MEMCHECK OK buffers=<k> rounds=<r> bytes=<checked> checksum=0x...`, exit 0; 2 bad argument, 3 no vGPU, 4 driver/device error, 6 mismatch",
    },
    PayloadInfo {
        name: "shm-pipe",
        summary: "Shared device memory between two VMs: a producer fills a shared object, a consumer checksums it on the device; vGPUs need the same --share-group on one GPU.",
        args: &[
            arg("role=<producer|consumer|intruder>", None, "which side (an intruder, outside the share group, must be refused)"),
            arg("key=<k>", None, "the shared object's key, the same on both sides"),
            arg("size_mib=<m>", None, "object size"),
            arg("items=<n>", None, "items handed over"),
        ],
        result: "`SHM-PIPE OK role=<r> items=<n> bytes=<b> ns_per_item=<t>`, exit 0; 2 bad argument, 3 no vGPU, 4 driver/device error, 6 mismatch, 7 timeout, 8 the intruder got in",
    },
    PayloadInfo {
        name: "storage",
        summary: "GPU-initiated storage: attaches storage namespace 1 (vgpuctl --storage 1=PATH), runs the gather, scan-sum and BFS storage kernels and checks every result.",
        args: &[
            arg("seed=<s>", Some("1"), "seed of the data the namespace holds (docs/storage.md)"),
            arg("words=<w>", Some("262144"), "u64 words at the start of the namespace"),
            arg("vertices=<n>", Some("20000"), "vertices of the CSR graph after them"),
            arg("missing=<id>", None, "a namespace whose file is gone: its attach must fail"),
        ],
        result: "`STORAGE OK gather=<n> scan=0x... bfs_reached=<r> bfs_depth=<d> bad_input=<k>`, exit 0; 2 bad argument, 3 no vGPU, 4 driver/device error, 6 mismatch, 7 a bad input not refused",
    },
    PayloadInfo {
        name: "streams",
        summary: "Several vGPU streams at once: independent batches per stream, a long kernel that must not delay the others, events and cross-stream fences.",
        args: &[
            arg("streams=<k>", Some("4"), "streams used (the vGPU needs --queues k)"),
            arg("n=<elements>", Some("4096"), "elements per stream"),
            arg("spin_us=<µs>", Some("300000"), "the long kernel"),
        ],
        result: "`STREAMS OK`, exit 0; a diagnostic and a non-zero code otherwise",
    },
    PayloadInfo {
        name: "vecadd",
        summary: "c = a + b with the built-in vector_add, synchronously and as one batch, checked element by element; reports the request round trip.",
        args: &[
            arg("n=<elements>", Some("16384"), "vector length"),
            arg("iters=<n>", Some("1000"), "round trips for the latency figure"),
        ],
        result: "`VECADD OK`, exit 0; a diagnostic and a non-zero code otherwise",
    },
    PayloadInfo {
        name: "vhost-echo",
        summary: "Test guest for the vmm's virtio-mmio transport against an in-test echo backend (not for vgpud's vGPUs).",
        args: &[
            arg("iters=<n>", Some("10000"), "round trips to time"),
            arg("until-reset", None, "keep one request in flight until the backend disappears"),
        ],
        result: "`ECHO OK`, exit 0; a diagnostic and a non-zero code otherwise",
    },
];

/// The payload called `name`.
pub fn find(name: &str) -> Option<&'static PayloadInfo> {
    PAYLOADS.iter().find(|p| p.name == name)
}

/// One argument of a payload, as the API lists it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PayloadArg {
    /// The word as given, e.g. `rounds=<n>` or `reset`.
    pub name: String,
    /// Its default, when it has one.
    pub default: Option<String>,
    /// What it does.
    pub description: String,
}

/// A payload ELF in vgpud's payload directory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Payload {
    /// The bare name `POST /v1/vms` takes as `payload`.
    pub name: String,
    /// Its path on the daemon's host.
    pub path: String,
    pub size_bytes: u64,
    /// What it does (null for a file that is not one of the payloads vgpu ships).
    pub description: Option<String>,
    /// Its arguments (`payload_arg`: space-separated words).
    pub args: Vec<PayloadArg>,
    /// What it prints at the end and how it exits.
    pub result: Option<String>,
}

impl Payload {
    /// The listing of file `name` at `path`, described from [`PAYLOADS`] when it is one.
    pub fn describe(name: &str, path: String, size_bytes: u64) -> Self {
        let info = find(name);
        Self {
            name: name.to_owned(),
            path,
            size_bytes,
            description: info.map(|i| i.summary.to_owned()),
            args: info
                .map(|i| {
                    i.args
                        .iter()
                        .map(|a| PayloadArg {
                            name: a.name.to_owned(),
                            default: a.default.map(str::to_owned),
                            description: a.what.to_owned(),
                        })
                        .collect()
                })
                .unwrap_or_default(),
            result: info.map(|i| i.result.to_owned()),
        }
    }
}

/// docs/payloads.md's table of payloads and arguments, in Markdown.
pub fn markdown() -> String {
    let mut s = String::new();
    for p in PAYLOADS {
        s.push_str(&format!("### `{}`\n\n{}\n\n", p.name, p.summary));
        if p.args.is_empty() {
            s.push_str("No arguments.\n\n");
        } else {
            s.push_str("| argument | default | what |\n| --- | --- | --- |\n");
            for a in p.args {
                s.push_str(&format!(
                    "| `{}` | {} | {} |\n",
                    a.name,
                    a.default.map_or("-".into(), |d| format!("`{d}`")),
                    a.what
                ));
            }
            s.push('\n');
        }
        s.push_str(&format!("Result: {}.\n\n", p.result));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_described() {
        for (i, p) in PAYLOADS.iter().enumerate() {
            assert!(
                PAYLOADS[i + 1..].iter().all(|q| q.name != p.name),
                "{}",
                p.name
            );
            assert!(!p.summary.is_empty() && !p.result.is_empty());
        }
        let d = Payload::describe("vecadd", "/p/vecadd".into(), 10);
        assert_eq!(d.args.len(), 2);
        assert_eq!(d.args[0].default.as_deref(), Some("16384"));
        let other = Payload::describe("mine", "/p/mine".into(), 1);
        assert!(other.description.is_none() && other.args.is_empty());
    }

    #[test]
    fn the_docs_list_every_payload() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/payloads.md");
        let doc = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            doc.contains(&markdown()),
            "docs/payloads.md is out of date with vgpu_api::payloads::PAYLOADS; print the table with\n  cargo test -p vgpu-api payloads_markdown -- --ignored --nocapture\nand paste it under \"The payloads\""
        );
    }

    /// Prints docs/payloads.md's table.
    #[test]
    #[ignore]
    fn payloads_markdown() {
        print!("{}", markdown());
    }
}
