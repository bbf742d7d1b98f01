//! `vgpuctl rebalancer ...`, `shm list`, `payload list`, `openapi`: the host-wide views.

use std::process::ExitCode;

use clap::Subcommand;
use vgpu_api::api::{RebalanceEvent, RebalancerStatus, ShmObject};
use vgpu_api::client::Client;
use vgpu_api::payloads::Payload;
use vgpu_api::units::human_bytes;

use crate::errors::Failure;
use crate::output::{emit, table};

#[derive(Subcommand, Debug)]
pub enum RebalancerCmd {
    /// Its mode and settings, and each GPU's and vGPU's measured demand. The mode is set
    /// when vgpud starts (`vgpud --rebalance off|balance|consolidate`).
    Status,
    /// Its decision log, oldest first: every migration it started and every overload,
    /// idle GPU or refusal it noticed, with the reason.
    Events {
        /// Only events with this id or later.
        #[arg(long, default_value_t = 0)]
        since: u64,
    },
}

#[derive(Subcommand, Debug)]
pub enum ShmCmd {
    /// List the shared device memory objects.
    List,
}

#[derive(Subcommand, Debug)]
pub enum PayloadCmd {
    /// List the payload ELFs in vgpud's --payload-dir with their arguments.
    List,
    /// Show one payload's arguments.
    Show { name: String },
}

pub fn rebalancer(c: &Client, json: bool, cmd: RebalancerCmd) -> Result<ExitCode, Failure> {
    match cmd {
        RebalancerCmd::Status => {
            let s: RebalancerStatus = c.call("GET", "/v1/rebalancer", None)?;
            emit(json, &s, rebalancer_text);
        }
        RebalancerCmd::Events { since } => {
            let ev: Vec<RebalanceEvent> =
                c.call("GET", &format!("/v1/rebalancer/events?since={since}"), None)?;
            emit(json, &ev, |e| events_rows(e));
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn shm(c: &Client, json: bool, cmd: ShmCmd) -> Result<ExitCode, Failure> {
    match cmd {
        ShmCmd::List => emit(json, &c.shm()?, |s| shm_rows(s)),
    }
    Ok(ExitCode::SUCCESS)
}

pub fn payload(c: &Client, json: bool, cmd: PayloadCmd) -> Result<ExitCode, Failure> {
    let list: Vec<Payload> = c.call("GET", "/v1/payloads", None)?;
    match cmd {
        PayloadCmd::List => emit(json, &list, |p| payload_rows(p)),
        PayloadCmd::Show { name } => {
            let Some(p) = list.into_iter().find(|p| p.name == name) else {
                return Err(Failure::usage(format!(
                    "no payload {name:?} in vgpud's --payload-dir; list them with `vgpuctl payload list`"
                )));
            };
            emit(json, &p, payload_detail);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn rebalancer_text(s: &RebalancerStatus) -> String {
    let mut out = format!(
        "mode {}, every {} ms, window {} ms, overload above {:.2}; {} migrations started; idle GPUs: {}\n\n",
        s.mode,
        s.interval_ms,
        s.window_ms,
        s.overload,
        s.migrations,
        if s.idle_gpus.is_empty() {
            "none".into()
        } else {
            s.idle_gpus
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        }
    );
    out.push_str(&table(
        &[
            "GPU",
            "LOAD",
            "COMPUTE",
            "COPY",
            "OVERLOADED",
            "IDLE",
            "VGPUS",
        ],
        s.gpus
            .iter()
            .map(|g| {
                vec![
                    g.gpu.to_string(),
                    format!("{:.2}", g.load),
                    format!("{:.2}", g.compute_demand),
                    format!("{:.2}", g.copy_demand),
                    if g.overloaded { "yes" } else { "no" }.into(),
                    if g.idle { "yes" } else { "no" }.into(),
                    g.vgpus.to_string(),
                ]
            })
            .collect(),
    ));
    if !s.vgpus.is_empty() {
        out.push('\n');
        out.push_str(&table(
            &[
                "VGPU",
                "GPU",
                "COMPUTE",
                "COPY",
                "RESIDENT",
                "ALLOCATED",
                "SHARE",
            ],
            s.vgpus
                .iter()
                .map(|v| {
                    vec![
                        v.vgpu.to_string(),
                        v.gpu.to_string(),
                        format!("{:.2}", v.compute_demand),
                        format!("{:.2}", v.copy_demand),
                        human_bytes(v.memory_resident_bytes),
                        human_bytes(v.memory_allocated_bytes),
                        human_bytes(v.memory_share_bytes),
                    ]
                })
                .collect(),
        ));
    }
    out
}

fn events_rows(e: &[RebalanceEvent]) -> String {
    let opt = |v: Option<u32>| v.map_or("-".into(), |x| x.to_string());
    table(
        &[
            "ID",
            "AT",
            "KIND",
            "GPU",
            "VGPU",
            "TO",
            "MIGRATION",
            "REASON",
        ],
        e.iter()
            .map(|e| {
                vec![
                    e.id.to_string(),
                    format!("{:.1}s", e.at_ms as f64 / 1000.0),
                    e.kind.clone(),
                    opt(e.gpu),
                    opt(e.vgpu),
                    opt(e.target_gpu),
                    opt(e.migration),
                    e.reason.clone(),
                ]
            })
            .collect(),
    )
}

fn shm_rows(s: &[ShmObject]) -> String {
    table(
        &[
            "ID", "KEY", "SIZE", "GPU", "GROUP", "CREATOR", "ATTACHED", "REMOVED",
        ],
        s.iter()
            .map(|o| {
                vec![
                    o.id.to_string(),
                    format!("{:#x}", o.key),
                    human_bytes(o.size_bytes),
                    o.gpu.to_string(),
                    o.share_group.clone(),
                    o.creator_vgpu.to_string(),
                    o.attached_vgpus
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(","),
                    if o.removed { "yes" } else { "no" }.into(),
                ]
            })
            .collect(),
    )
}

fn payload_rows(p: &[Payload]) -> String {
    table(
        &["NAME", "SIZE", "ARGUMENTS"],
        p.iter()
            .map(|p| {
                vec![
                    p.name.clone(),
                    human_bytes(p.size_bytes),
                    if p.description.is_none() {
                        "(not a payload vgpu ships)".into()
                    } else if p.args.is_empty() {
                        "-".into()
                    } else {
                        p.args
                            .iter()
                            .map(|a| a.name.clone())
                            .collect::<Vec<_>>()
                            .join(" ")
                    },
                ]
            })
            .collect(),
    )
}

fn payload_detail(p: &Payload) -> String {
    let mut s = format!("{} ({}, {})\n", p.name, p.path, human_bytes(p.size_bytes));
    if let Some(d) = &p.description {
        s.push_str(&format!("{d}\n"));
    }
    if !p.args.is_empty() {
        s.push('\n');
        s.push_str(&table(
            &["ARGUMENT", "DEFAULT", "WHAT"],
            p.args
                .iter()
                .map(|a| {
                    vec![
                        a.name.clone(),
                        a.default.clone().unwrap_or_else(|| "-".into()),
                        a.description.clone(),
                    ]
                })
                .collect(),
        ));
    }
    if let Some(r) = &p.result {
        s.push_str(&format!("\nResult: {r}\n"));
    }
    s
}
