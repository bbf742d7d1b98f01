//! REST request bodies through vgpud's own extractor (`daemon::http::parse_json`: the
//! same function `ApiJson` calls, with its error-to-field mapping), every body type the API
//! accepts, the unit parsers vgpuctl feeds it, and the daemon <-> worker control messages.
//! Invariant 1 for the REST side: any body is a 400 naming a field, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vgpu_api::api::{MigrateRequest, VgpuCreate, VgpuPatch, VmCreate};
use vgpu_api::control::{Request, WorkerMessage};
use vgpud::daemon::http::parse_json;
use vgpu_api::units;

fn shares(v: f64) {
    let p = units::fraction_to_permille(v);
    let _ = units::permille_to_fraction(p);
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    match sel % 8 {
        0 => {
            if let Ok(v) = parse_json::<VgpuCreate>(body) {
                shares(v.compute_share);
                v.copy_share.map(shares);
                let _ = units::human_bytes(v.memory_bytes);
                let back = serde_json::to_vec(&v).expect("serialises");
                let again = parse_json::<VgpuCreate>(&back).expect("round trip");
                // f64 fields may not compare equal after printing; the rest must.
                assert_eq!(again.memory_bytes, v.memory_bytes);
                assert_eq!(again.share_group, v.share_group);
            }
        }
        1 => {
            if let Ok(v) = parse_json::<VgpuPatch>(body) {
                v.compute_share.map(shares);
                v.copy_share.map(shares);
            }
        }
        2 => {
            if let Ok(v) = parse_json::<VmCreate>(body) {
                let _ = units::human_bytes(v.memory_bytes);
                let back = serde_json::to_vec(&v).expect("serialises");
                parse_json::<VmCreate>(&back).expect("round trip");
            }
        }
        3 => {
            let _ = parse_json::<MigrateRequest>(body);
        }
        4 => {
            let _ = serde_json::from_slice::<Request>(body);
        }
        5 => {
            let _ = serde_json::from_slice::<WorkerMessage>(body);
        }
        _ => {
            if let Ok(s) = std::str::from_utf8(body) {
                let _ = units::parse_size(s);
                let _ = units::parse_bandwidth(s);
                let _ = units::parse_share_fraction(s);
                let _ = units::parse_share(s);
            }
        }
    }
});
