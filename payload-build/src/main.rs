//! `payload-build [--out DIR]`: builds every payload and prints `name path` per line; with
//! `--out`, also copies the ELFs into DIR (a bundle for machines without cargo, used via
//! VGPU_PAYLOAD_DIR).

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut out: Option<PathBuf> = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--out" => match args.next() {
                Some(dir) => out = Some(dir.into()),
                None => return usage("--out needs a directory"),
            },
            "-h" | "--help" => {
                println!("usage: payload-build [--out DIR]");
                return ExitCode::SUCCESS;
            }
            other => return usage(&format!("unknown argument {other:?}")),
        }
    }
    if let Some(dir) = &out {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("payload-build: {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
    }
    for name in payload_build::PAYLOADS {
        let path = match payload_build::payload(name) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("payload-build: {e}");
                return ExitCode::FAILURE;
            }
        };
        let shown = match &out {
            None => path,
            Some(dir) => {
                let dest = dir.join(name);
                if let Err(e) = std::fs::copy(&path, &dest) {
                    eprintln!(
                        "payload-build: copy {} to {}: {e}",
                        path.display(),
                        dest.display()
                    );
                    return ExitCode::FAILURE;
                }
                dest
            }
        };
        println!("{name} {}", shown.display());
    }
    ExitCode::SUCCESS
}

fn usage(problem: &str) -> ExitCode {
    eprintln!("payload-build: {problem}\nusage: payload-build [--out DIR]");
    ExitCode::from(2)
}
