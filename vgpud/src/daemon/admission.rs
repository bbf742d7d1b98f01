//! Admission: a vGPU request validated into a `VgpuAsk` (`state/ask.rs`), checked against what a GPU
//! has left ([`misfit`], the one place the admission rule is applied), placed and
//! recorded.

use std::collections::BTreeMap;

use super::config::Config;
use super::core::Daemon;
use super::error::ApiError;
use super::state::{Inner, VgpuAsk, VgpuDef, VgpuRec};
use super::storage;
use crate::api::VgpuCreate;
use crate::units::{fraction_to_permille, human_bytes};
use vgpu_scheduler::admission::{self, Engine, Misfit, WHOLE};

/// Most queues per vGPU (vgpu-device's limit).
const MAX_QUEUES: u16 = 64;

/// The kernel deadlines a vGPU may ask for, ms.
pub(super) const KERNEL_DEADLINE_MS: std::ops::RangeInclusive<u32> = 10..=60_000;

/// A vGPU's own kernel deadline, ms.
pub(super) fn validate_kernel_deadline(ms: u32) -> Result<(), ApiError> {
    if KERNEL_DEADLINE_MS.contains(&ms) {
        Ok(())
    } else {
        Err(ApiError::bad(
            "kernel_deadline_ms",
            format!(
                "{ms} ms is not a kernel deadline: give {} to {} ms",
                KERNEL_DEADLINE_MS.start(),
                KERNEL_DEADLINE_MS.end()
            ),
        ))
    }
}

/// A share given as a fraction of a GPU, in per-mille.
pub(super) fn share(field: &str, v: f64) -> Result<u32, ApiError> {
    if !(v.is_finite() && (0.0..=1.0).contains(&v)) {
        return Err(ApiError::bad(
            field,
            format!("{v} is not a share: give a fraction of the GPU between 0 and 1 (0.3 = 30%)"),
        ));
    }
    Ok(fraction_to_permille(v))
}

fn pct(permille: u32) -> String {
    format!("{:.1}%", f64::from(permille) / 10.0)
}

fn validate_share_group(g: &str) -> Result<(), ApiError> {
    let ok = (1..=64).contains(&g.len())
        && g.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad(
            "share_group",
            format!("{g:?} is not a share group name: use 1 to 64 characters of A-Z a-z 0-9 _ . -"),
        ))
    }
}

/// Most labels per object.
const MAX_LABELS: usize = 16;
/// Longest label value.
const MAX_LABEL_VALUE: usize = 256;

/// A name: a DNS label (1 to 63 of `a-z 0-9 -`, a letter or digit at both ends).
pub(super) fn validate_name(n: &str) -> Result<(), ApiError> {
    let b = n.as_bytes();
    let ok = (1..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric);
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad(
            "name",
            format!("{n:?} is not a name: use 1 to 63 characters of a-z 0-9 -, starting and ending with a letter or digit (e.g. \"train-a\")"),
        ))
    }
}

/// Labels: at most [`MAX_LABELS`], keys 1 to 63 of `A-Z a-z 0-9 _ . - /`, values at most
/// [`MAX_LABEL_VALUE`] characters with no control characters.
pub(super) fn validate_labels(labels: &BTreeMap<String, String>) -> Result<(), ApiError> {
    if labels.len() > MAX_LABELS {
        return Err(ApiError::bad(
            "labels",
            format!("{} labels: give at most {MAX_LABELS}", labels.len()),
        ));
    }
    for (k, v) in labels {
        let key_ok = (1..=63).contains(&k.len())
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b'/'));
        if !key_ok {
            return Err(ApiError::bad(
                "labels",
                format!("{k:?} is not a label key: use 1 to 63 characters of A-Z a-z 0-9 _ . - /"),
            ));
        }
        if v.chars().count() > MAX_LABEL_VALUE || v.chars().any(char::is_control) {
            return Err(ApiError::bad(
                &format!("labels.{k}"),
                format!("label values are at most {MAX_LABEL_VALUE} characters with no control characters"),
            ));
        }
    }
    Ok(())
}

/// `name` is not taken by a live vGPU other than `except`. Caller holds the state lock.
pub(super) fn name_free(inner: &Inner, name: &str, except: Option<u32>) -> Result<(), ApiError> {
    match inner.vgpu_named(name, except) {
        Some(other) => Err(ApiError::conflict(
            "name",
            format!("the name {name:?} is taken by vGPU {other}; pick another"),
        )),
        None => Ok(()),
    }
}

/// A VM's name and labels, checked.
pub(super) fn validate_vm_meta(
    name: Option<&str>,
    labels: &BTreeMap<String, String>,
) -> Result<(), ApiError> {
    if let Some(n) = name {
        validate_name(n)?;
    }
    validate_labels(labels)
}

/// `name` (if any) is not taken by a live VM. Caller holds the state lock.
pub(super) fn vm_name_free(inner: &Inner, name: Option<&str>) -> Result<(), ApiError> {
    let Some(name) = name else { return Ok(()) };
    match inner
        .vms
        .values()
        .find(|v| v.state().is_live() && v.name().as_deref() == Some(name))
    {
        Some(other) => Err(ApiError::conflict(
            "name",
            format!(
                "the name {name:?} is taken by VM {}; pick another",
                other.id()
            ),
        )),
        None => Ok(()),
    }
}

/// Checks a vGPU request field by field (nothing is admitted yet).
pub(super) fn validate_vgpu(d: &Daemon, spec: &VgpuCreate) -> Result<VgpuAsk, ApiError> {
    if spec.memory_bytes == 0 {
        return Err(ApiError::bad(
            "memory_bytes",
            "a vGPU needs some device memory: give memory_bytes > 0",
        ));
    }
    let compute = share("compute_share", spec.compute_share)?;
    let copy = match spec.copy_share {
        Some(c) => share("copy_share", c)?,
        None => compute,
    };
    if spec.queues == 0 || spec.queues > MAX_QUEUES {
        return Err(ApiError::bad(
            "queues",
            format!("{} queues: give 1 to {MAX_QUEUES}", spec.queues),
        ));
    }
    if let Some(g) = &spec.share_group {
        validate_share_group(g)?;
    }
    storage::validate(
        &spec.storage,
        d.cfg.storage_root.as_deref(),
        &d.cfg.state_dir,
    )?;
    if let Some(n) = &spec.name {
        validate_name(n)?;
    }
    validate_labels(&spec.labels)?;
    super::attach::validate(spec)?;
    if let Some(ms) = spec.kernel_deadline_ms {
        validate_kernel_deadline(ms)?;
    }
    validate_memory(d, spec.gpu, spec.memory_bytes)?;
    Ok(VgpuAsk {
        gpu: spec.gpu,
        memory: spec.memory_bytes,
        compute,
        copy,
        priority: spec.priority,
        oversubscribe: spec.oversubscribe,
        share_group: spec.share_group.clone(),
        queues: spec.queues,
        storage: spec.storage.clone(),
        name: spec.name.clone(),
        labels: spec.labels.clone(),
        kernel_deadline_ms: spec.kernel_deadline_ms,
    })
}

/// The GPU asked for exists and `memory` is no more than it (or, unplaced, some GPU)
/// has.
fn validate_memory(d: &Daemon, gpu: Option<u32>, memory: u64) -> Result<(), ApiError> {
    if let Some(g) = gpu {
        let Some(cfg) = d.gpu(g) else {
            return Err(d.no_gpu("gpu", g));
        };
        if memory > cfg.memory {
            return Err(ApiError::bad(
                "memory_bytes",
                format!(
                    "{} is more than GPU {g} has ({}); ask for less",
                    human_bytes(memory),
                    human_bytes(cfg.memory)
                ),
            ));
        }
    } else if d.cfg.gpus.iter().all(|g| memory > g.memory) {
        return Err(ApiError::bad(
            "memory_bytes",
            format!(
                "{} is more than any GPU of this host has; ask for less",
                human_bytes(memory)
            ),
        ));
    }
    Ok(())
}

/// Why `ask` does not fit on `gpu` (leaving out vGPU `except`'s commitments), or None
/// when it fits. The admission rule: every use of it goes through here.
pub(super) fn misfit(
    cfg: &Config,
    inner: &Inner,
    gpu: u32,
    ask: &VgpuAsk,
    except: Option<u32>,
) -> Option<ApiError> {
    let g = cfg.gpus.get(gpu as usize)?;
    let c = inner.committed(gpu, except);
    // Oversubscribed vGPUs reserve nothing at admission and bring nothing resident.
    let room = admission::Room {
        gpu,
        memory: g.memory,
        committed_memory: c.memory,
        committed_compute: c.compute,
        committed_copy: c.copy,
        pool_free: u64::MAX,
    };
    let want = admission::Ask {
        memory: ask.memory,
        compute: ask.compute,
        copy: ask.copy,
        oversubscribe: ask.oversubscribe,
        resident: 0,
    };
    Some(match admission::misfit(&want, &room)? {
        Misfit::Memory { free, total, committed, .. } => ApiError::conflict(
            "memory_bytes",
            format!(
                "GPU {gpu} has {} free of {} ({} committed to other vGPUs); ask for at most {} or pick another GPU",
                human_bytes(free),
                human_bytes(total),
                human_bytes(committed),
                human_bytes(free)
            ),
        ),
        Misfit::Share { engine, have, want, .. } => {
            let field = if engine == Engine::Compute { "compute_share" } else { "copy_share" };
            ApiError::conflict(
                field,
                format!(
                    "{field} {} would bring GPU {gpu} to {} ({} already committed); at most {} is left",
                    pct(want),
                    pct(have.saturating_add(want)),
                    pct(have),
                    pct(WHOLE.saturating_sub(have))
                ),
            )
        }
        m @ Misfit::Pool { .. } => ApiError::conflict("memory_bytes", m.to_string()),
    })
}

/// The GPU `ask` goes on: the one it names if it fits there, else the best of those it
/// fits on. Caller holds the state lock.
fn place(d: &Daemon, inner: &Inner, ask: &VgpuAsk) -> Result<u32, ApiError> {
    if let Some(g) = ask.gpu {
        return match misfit(&d.cfg, inner, g, ask, None) {
            Some(e) => Err(e),
            None => Ok(g),
        };
    }
    let mut fits = Vec::new();
    let mut first_err = None;
    for g in d.gpu_indices() {
        match misfit(&d.cfg, inner, g, ask, None) {
            None => fits.push(g),
            Some(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    // By measured load and free memory share.
    d.rb()
        .place(&d.cfg, inner, &d.memory, ask, &fits)
        .ok_or_else(|| {
            let why = first_err.map(|e| e.error).unwrap_or_default();
            ApiError::conflict("gpu", format!("no GPU has room for this vGPU (e.g. {why})"))
        })
}

/// Admits `ask` and inserts its record (state `starting`). Caller holds the state lock.
pub(super) fn admit(
    d: &Daemon,
    inner: &mut Inner,
    ask: VgpuAsk,
    vm: Option<u32>,
) -> Result<u32, ApiError> {
    if let Some(n) = &ask.name {
        name_free(inner, n, None)?;
    }
    let gpu = place(d, inner, &ask)?;
    let id = inner.next_vgpu;
    inner.next_vgpu += 1;
    let rec = VgpuRec::admitted(VgpuDef {
        id,
        gpu,
        memory: ask.memory,
        compute: ask.compute,
        copy: ask.copy,
        priority: ask.priority,
        oversubscribe: ask.oversubscribe,
        share_group: ask.share_group,
        queues: ask.queues,
        storage: ask.storage,
        vm,
        owned: vm.is_some(),
        socket: super::worker_files::worker_socket(&d.cfg.state_dir, id),
        log: d.cfg.state_dir.join(format!("vgpu-{id}.log")),
        restore_failed: false,
        name: ask.name,
        labels: ask.labels,
        kernel_deadline_ms: ask.kernel_deadline_ms,
        process: None,
    });
    tracing::info!(
        vgpu = id,
        gpu,
        memory = ask.memory,
        compute = ask.compute,
        copy = ask.copy,
        "vGPU admitted"
    );
    inner.vgpus.insert(id, rec);
    Ok(id)
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::core::testing::{daemon, spec};
    use super::*;
    use crate::api::VgpuState;

    pub(in crate::daemon) fn admit(d: &Daemon, s: VgpuCreate) -> Result<u32, ApiError> {
        let ask = validate_vgpu(d, &s)?;
        d.state.with(|inner| super::admit(d, inner, ask, None))
    }

    #[test]
    fn shares_and_memory_are_admitted_up_to_the_gpu() {
        let d = daemon(1);
        admit(&d, spec(Some(0), 3 << 30, 0.7)).expect("fits");
        let e = admit(&d, spec(Some(0), 1 << 20, 0.31)).expect_err("compute past 100%");
        assert_eq!(
            (e.status, e.field.as_deref()),
            (axum::http::StatusCode::CONFLICT, Some("compute_share"))
        );
        assert!(e.error.contains("at most 30.0% is left"), "{e}");
        let e = admit(&d, spec(Some(0), 2 << 30, 0.1)).expect_err("memory past the GPU");
        assert_eq!(e.field.as_deref(), Some("memory_bytes"));
        admit(&d, spec(Some(0), 1 << 30, 0.3)).expect("exactly full fits");
        let g = &super::super::stats::gpus(&d)[0];
        assert_eq!((g.memory_free_bytes, g.compute_committed), (0, 1.0));
        // Released and failed vGPUs hold nothing.
        d.state.with(|i| {
            for r in i.vgpus.values_mut() {
                r.end_worker(VgpuState::Released);
            }
        });
        assert_eq!(super::super::stats::gpus(&d)[0].memory_committed_bytes, 0);
        admit(&d, spec(Some(0), 4 << 30, 1.0)).expect("all free again");
    }

    #[test]
    fn placement_picks_the_least_loaded_gpu_that_fits() {
        let d = daemon(3);
        admit(&d, spec(Some(0), 1 << 30, 0.5)).expect("gpu 0");
        admit(&d, spec(Some(1), 1 << 30, 0.2)).expect("gpu 1");
        admit(&d, spec(Some(2), 4 << 30, 0.1)).expect("gpu 2 memory full");
        let id = admit(&d, spec(None, 1 << 30, 0.3)).expect("placed");
        assert_eq!(
            d.state.with(|i| i.vgpus[&id].gpu()),
            1,
            "gpu 2 is less loaded but has no memory left"
        );
        let e = admit(&d, spec(None, 1 << 30, 0.9)).expect_err("nowhere");
        assert_eq!(e.field.as_deref(), Some("gpu"));
    }

    #[test]
    fn bad_specs_name_their_field() {
        let d = daemon(1);
        for (s, field) in [
            (spec(Some(0), 0, 0.1), "memory_bytes"),
            (spec(Some(0), 1, f64::NAN), "compute_share"),
            (spec(Some(0), 1, -0.1), "compute_share"),
            (spec(Some(5), 1, 0.1), "gpu"),
            (spec(None, 5 << 30, 0.1), "memory_bytes"),
            (
                VgpuCreate {
                    copy_share: Some(2.0),
                    ..spec(None, 1, 0.1)
                },
                "copy_share",
            ),
            (
                VgpuCreate {
                    queues: 65,
                    ..spec(None, 1, 0.1)
                },
                "queues",
            ),
            (
                VgpuCreate {
                    share_group: Some(String::new()),
                    ..spec(None, 1, 0.1)
                },
                "share_group",
            ),
            (
                VgpuCreate {
                    oversubscribe: true,
                    ..spec(None, 8 << 30, 0.1)
                },
                "memory_bytes",
            ),
        ] {
            let e = validate_vgpu(&d, &s).expect_err("invalid");
            assert_eq!(e.field.as_deref(), Some(field), "{e}");
        }
        assert!(
            d.state.with(|i| i.vgpus.is_empty()),
            "validation changed the state"
        );
    }

    #[test]
    fn names_and_labels_are_checked_and_names_unique_among_live_vgpus() {
        let d = daemon(1);
        let named = |n: &str| VgpuCreate {
            name: Some(n.into()),
            ..spec(Some(0), 1 << 20, 0.1)
        };
        for bad in [
            "",
            "Upper",
            "-dash",
            "dash-",
            "under_score",
            &"x".repeat(64),
        ] {
            let e = validate_vgpu(&d, &named(bad)).expect_err(bad);
            assert_eq!(e.field.as_deref(), Some("name"), "{bad:?}: {e}");
        }
        let a = admit(&d, named("train-a")).expect("named");
        let e = admit(&d, named("train-a")).expect_err("taken");
        assert_eq!(
            (e.status, e.field.as_deref()),
            (axum::http::StatusCode::CONFLICT, Some("name"))
        );
        assert!(e.error.contains(&format!("vGPU {a}")), "{e}");
        // A released vGPU gives its name back.
        d.state.with(|i| {
            if let Some(r) = i.vgpus.get_mut(&a) {
                r.end_worker(VgpuState::Released);
            }
        });
        admit(&d, named("train-a")).expect("free again");

        let labelled = |l: Vec<(&str, &str)>| VgpuCreate {
            labels: l.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
            ..spec(Some(0), 1 << 20, 0.1)
        };
        validate_vgpu(
            &d,
            &labelled(vec![("team", "vision"), ("example.com/tier", "gold")]),
        )
        .expect("valid labels");
        let many: Vec<(String, String)> = (0..17).map(|i| (format!("k{i}"), "v".into())).collect();
        let too_many = VgpuCreate {
            labels: many.into_iter().collect(),
            ..spec(Some(0), 1 << 20, 0.1)
        };
        for (s, field) in [
            (too_many, "labels"),
            (labelled(vec![("bad key", "v")]), "labels"),
            (labelled(vec![("k", "line\nbreak")]), "labels.k"),
            (labelled(vec![("k", &"v".repeat(257))]), "labels.k"),
        ] {
            let e = validate_vgpu(&d, &s).expect_err("invalid labels");
            assert_eq!(e.field.as_deref(), Some(field), "{e}");
        }
    }
}
