//! Errors in CLI terms: the API's `field` becomes the flag the user typed, a 401 says
//! which option carries the token, and every failure has a documented exit code.

use std::process::ExitCode;

use vgpu_api::client::ClientError;

/// Exit codes (docs/api.md, "vgpuctl"): besides these, `vm wait` and `vm launch --wait`
/// exit with the guest's own exit code.
pub mod code {
    /// The request failed (the message says why).
    pub const FAILED: u8 = 1;
    /// vgpud is not running at the socket or URL.
    pub const NOT_RUNNING: u8 = 3;
    /// A migration completed, but its pause was longer than `--max-downtime-ms`.
    pub const DOWNTIME_EXCEEDED: u8 = 4;
    /// The VM was stopped by a vgpud restart (it is not running any more).
    pub const STOPPED_BY_RESTART: u8 = 123;
    /// `vm wait --timeout-s` ran out while the VM still runs.
    pub const STILL_RUNNING: u8 = 124;
    /// The VM failed: its vmm was killed or crashed, or its vGPU's worker died.
    pub const VM_FAILED: u8 = 125;
}

/// The command a request came from, which decides what an API field is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Context {
    /// `vgpu create` (`POST /v1/vgpus`).
    VgpuCreate,
    /// `vgpu set` (`PATCH /v1/vgpus/{id}`).
    VgpuSet,
    /// `vm launch` (`POST /v1/vms`, its inline vGPU under `vgpu.`).
    VmLaunch,
    /// `vgpu migrate`, `vm migrate`.
    Migrate,
    /// Anything else: only path parameters.
    Other,
}

/// API field → CLI flag, per command. Nested fields (`vgpu.copy_share`,
/// `storage[1].path`) are looked up by their path without indices.
const FLAGS: &[(Context, &str, &str)] = &[
    (Context::VgpuCreate, "gpu", "--gpu"),
    (Context::VgpuCreate, "memory_bytes", "--memory"),
    (Context::VgpuCreate, "compute_share", "--compute"),
    (Context::VgpuCreate, "copy_share", "--copy"),
    (Context::VgpuCreate, "priority", "--priority"),
    (Context::VgpuCreate, "queues", "--queues"),
    (Context::VgpuCreate, "share_group", "--share-group"),
    (Context::VgpuCreate, "oversubscribe", "--oversubscribe"),
    (Context::VgpuCreate, "storage", "--storage"),
    (Context::VgpuCreate, "storage.namespace", "--storage"),
    (Context::VgpuCreate, "storage.path", "--storage"),
    (Context::VgpuCreate, "storage.read_only", "--storage"),
    (Context::VgpuCreate, "attach", "--attach"),
    (Context::VgpuCreate, "owner_uid", "--owner-uid"),
    (Context::VgpuCreate, "owner_gid", "--owner-gid"),
    (Context::VgpuSet, "compute_share", "--compute"),
    (Context::VgpuSet, "copy_share", "--copy"),
    (Context::VgpuSet, "priority", "--priority"),
    (Context::VmLaunch, "payload", "--payload"),
    (Context::VmLaunch, "payload_arg", "--arg"),
    (Context::VmLaunch, "memory_bytes", "--ram"),
    (Context::VmLaunch, "vcpus", "--vcpus"),
    (Context::VmLaunch, "vgpu_id", "--vgpu"),
    (Context::VmLaunch, "vgpu", "--vgpu"),
    (Context::Migrate, "target_gpu", "--target-gpu"),
    (Context::Migrate, "mode", "--mode"),
    (Context::Migrate, "max_downtime_ms", "--max-downtime-ms"),
];

/// Requests on one object that vgpud's hints name with its id (`DELETE /v1/vms/3`) → the
/// vgpuctl command that makes them (`ID` stands for the id).
const ID_COMMANDS: &[(&str, &str)] = &[
    ("DELETE /v1/vms/", "`vgpuctl vm delete ID`"),
    ("DELETE /v1/vgpus/", "`vgpuctl vgpu delete ID`"),
    ("GET /v1/vms/", "`vgpuctl vm show ID`"),
    ("GET /v1/vgpus/", "`vgpuctl vgpu show ID`"),
    ("GET /v1/migrations/", "`vgpuctl migration show ID`"),
];

/// Endpoints that vgpud's hints name → the vgpuctl command that reads them (longest
/// first, so `/v1/migrations/{id}` wins over `/v1/migrations`).
const COMMANDS: &[(&str, &str)] = &[
    ("GET /v1/rebalancer/events", "`vgpuctl rebalancer events`"),
    ("GET /v1/migrations/{id}", "`vgpuctl migration show ID`"),
    ("GET /v1/migrations", "`vgpuctl migration list`"),
    ("GET /v1/rebalancer", "`vgpuctl rebalancer status`"),
    ("GET /v1/payloads", "`vgpuctl payload list`"),
    ("GET /v1/vgpus", "`vgpuctl vgpu list`"),
    ("GET /v1/vms", "`vgpuctl vm list`"),
    ("GET /v1/gpus", "`vgpuctl gpus`"),
    ("GET /v1/shm", "`vgpuctl shm list`"),
];

/// `text` with the endpoints it names as the vgpuctl commands that read them.
fn cli_commands(text: &str) -> String {
    let mut out = text.to_owned();
    for (prefix, command) in ID_COMMANDS {
        let mut done = String::with_capacity(out.len());
        let mut rest = out.as_str();
        while let Some(i) = rest.find(prefix) {
            let after = &rest[i + prefix.len()..];
            let digits = after.bytes().take_while(u8::is_ascii_digit).count();
            done.push_str(&rest[..i]);
            if digits > 0 {
                done.push_str(&command.replace("ID", &after[..digits]));
            } else {
                done.push_str(prefix);
            }
            rest = &after[digits..];
        }
        done.push_str(rest);
        out = done;
    }
    for (endpoint, command) in COMMANDS {
        out = out.replace(endpoint, command);
    }
    out
}

/// The flag for API field `field` of a request made by `ctx` (None: no flag; the field
/// is a path parameter or something the CLI does not set).
pub fn flag_for(ctx: Context, field: &str) -> Option<String> {
    if field == "id" {
        return Some("ID".into());
    }
    let plain: String = {
        // `storage[1].path` → `storage.path`
        let mut s = String::with_capacity(field.len());
        let mut skip = false;
        for ch in field.chars() {
            match ch {
                '[' => skip = true,
                ']' => skip = false,
                c if !skip => s.push(c),
                _ => {}
            }
        }
        s
    };
    // An inline vGPU of `vm launch` takes the `vgpu create` flags.
    if ctx == Context::VmLaunch {
        if let Some(rest) = plain.strip_prefix("vgpu.") {
            return flag_for(Context::VgpuCreate, rest);
        }
    }
    FLAGS
        .iter()
        .find(|(c, f, _)| *c == ctx && *f == plain)
        .map(|(_, _, flag)| (*flag).to_owned())
}

/// `text` with whole-word occurrences of `word` replaced by `by`.
fn replace_word(text: &str, word: &str, by: &str) -> String {
    if word.is_empty() {
        return text.to_owned();
    }
    let is_word = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '/');
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(word) {
        let before = rest[..i].chars().next_back();
        let after = rest[i + word.len()..].chars().next();
        out.push_str(&rest[..i]);
        if before.is_some_and(is_word) || after.is_some_and(is_word) {
            out.push_str(word);
        } else {
            out.push_str(by);
        }
        rest = &rest[i + word.len()..];
    }
    out.push_str(rest);
    out
}

/// The message a CLI user sees for `e`, made by a `ctx` command.
pub fn message(ctx: Context, e: &ClientError) -> String {
    match e {
        ClientError::NotRunning { endpoint, why } if why.contains("ermission denied") => format!(
            "vgpud's socket {endpoint} is not open to this user ({why}): the service's socket belongs to root; run vgpuctl as root (sudo vgpuctl ...)"
        ),
        ClientError::NotRunning { endpoint, why } => format!(
            "vgpud is not running at {endpoint} ({why}): start it (`systemctl start vgpud` where the package is installed, `vgpud` otherwise), or point --socket/--url at it"
        ),
        ClientError::Api { body, .. } if body.field.as_deref() == Some("destination.token") => format!(
            "--to-token-file: {}: pass --to-token-file FILE with the token the destination vgpud was started with (its --token-file; this vgpud's own is --token-file)",
            body.error
        ),
        ClientError::Api { status: 401, .. } => "vgpud refused the request (401): it needs its bearer token; pass --token-file FILE (or set VGPUD_TOKEN_FILE) with the token vgpud was started with".into(),
        ClientError::Api { status, body } => {
            let body = &vgpu_api::api::ErrorBody {
                error: cli_commands(&body.error),
                field: body.field.clone(),
            };
            let Some(field) = body.field.as_deref() else {
                return format!("vgpud refused ({status}): {}", body.error);
            };
            match flag_for(ctx, field) {
                Some(flag) => {
                    let leaf = field.rsplit('.').next().unwrap_or(field);
                    let mut text = replace_word(&body.error, field, &flag);
                    if leaf != "id" {
                        text = replace_word(&text, leaf, &flag);
                    }
                    let hint = if flag == "--copy" && leaf == "copy_share" && ctx != Context::VgpuSet {
                        " (without --copy the copy share is the compute share; give --copy to set it apart)"
                    } else {
                        ""
                    };
                    format!("{flag}: {text}{hint} (vgpud answered {status})")
                }
                None => format!("vgpud refused ({status}, field `{field}`): {}", body.error),
            }
        }
        other => other.to_string(),
    }
}

/// A failed command: the error and the command it came from.
#[derive(Debug)]
pub struct Failure {
    pub ctx: Context,
    pub err: ClientError,
}

impl From<ClientError> for Failure {
    fn from(err: ClientError) -> Self {
        Self {
            ctx: Context::Other,
            err,
        }
    }
}

impl Failure {
    /// `map_err` helper: the error came from a `ctx` request.
    pub fn within(ctx: Context) -> impl FnOnce(ClientError) -> Failure {
        move |err| Failure { ctx, err }
    }

    /// A usage error.
    pub fn usage(msg: impl Into<String>) -> Self {
        ClientError::Usage(msg.into()).into()
    }
}

/// The exit code for `e`.
pub fn exit_code(e: &ClientError) -> ExitCode {
    ExitCode::from(match e {
        ClientError::NotRunning { .. } => code::NOT_RUNNING,
        _ => code::FAILED,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_api::api::ErrorBody;

    fn api(status: u16, field: Option<&str>, error: &str) -> ClientError {
        ClientError::Api {
            status,
            body: ErrorBody {
                error: error.into(),
                field: field.map(str::to_owned),
            },
        }
    }

    #[test]
    fn fields_become_flags() {
        assert_eq!(
            flag_for(Context::VmLaunch, "memory_bytes").as_deref(),
            Some("--ram")
        );
        assert_eq!(
            flag_for(Context::VgpuCreate, "memory_bytes").as_deref(),
            Some("--memory")
        );
        assert_eq!(
            flag_for(Context::VmLaunch, "vgpu.copy_share").as_deref(),
            Some("--copy")
        );
        assert_eq!(
            flag_for(Context::VmLaunch, "vgpu.storage[0].path").as_deref(),
            Some("--storage")
        );
        assert_eq!(
            flag_for(Context::Migrate, "target_gpu").as_deref(),
            Some("--target-gpu")
        );
        assert_eq!(flag_for(Context::Other, "id").as_deref(), Some("ID"));
        assert_eq!(flag_for(Context::Other, "state_file"), None);
    }

    #[test]
    fn messages_speak_cli() {
        let m = message(
            Context::VmLaunch,
            &api(
                400,
                Some("memory_bytes"),
                "8 of guest RAM: bad memory_bytes",
            ),
        );
        assert!(m.starts_with("--ram: "), "{m}");
        assert!(!m.contains("memory_bytes"), "{m}");
        let m = message(
            Context::VmLaunch,
            &api(409, Some("vgpu.copy_share"), "copy_share would exceed 100%"),
        );
        assert!(m.starts_with("--copy: --copy would exceed"), "{m}");
        let m = message(
            Context::Other,
            &api(401, None, "send Authorization: Bearer"),
        );
        assert!(m.contains("--token-file FILE"), "{m}");
        assert!(!m.contains("Authorization"), "{m}");
        let m = message(
            Context::Migrate,
            &api(
                409,
                Some("id"),
                "vGPU 3 is already migrating; follow GET /v1/migrations",
            ),
        );
        assert!(
            m.ends_with("follow `vgpuctl migration list` (vgpud answered 409)"),
            "{m}"
        );
        let m = message(
            Context::Other,
            &api(
                409,
                Some("id"),
                "vGPU 5 is in use by running VM 3; DELETE /v1/vms/3 first",
            ),
        );
        assert!(
            m.contains("use by running VM 3; `vgpuctl vm delete 3` first"),
            "{m}"
        );
        assert!(!m.contains("/v1/"), "{m}");
        let m = message(
            Context::Migrate,
            &api(
                401,
                Some("destination.token"),
                "the destination vgpud refused the VM: the destination's bearer token is missing or wrong",
            ),
        );
        assert!(
            m.starts_with("--to-token-file: the destination vgpud refused"),
            "{m}"
        );
        assert!(m.contains("pass --to-token-file FILE"), "{m}");
        let m = message(
            Context::Other,
            &ClientError::NotRunning {
                endpoint: "/run/vgpud/vgpud.sock".into(),
                why: "Permission denied (os error 13)".into(),
            },
        );
        assert!(
            m.contains("not open to this user") && m.contains("sudo"),
            "{m}"
        );
        assert!(!m.contains("not running"), "{m}");
        assert_eq!(
            replace_word("a memory_bytes_x b", "memory_bytes", "--x"),
            "a memory_bytes_x b"
        );
    }
}
