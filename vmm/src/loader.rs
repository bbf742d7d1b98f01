//! Loads a payload ELF: checks every loadable segment lands in guest RAM above the boot
//! area before linux-loader copies it in, so a bad image is an error, never a stray write.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use linux_loader::elf::{Elf64_Ehdr, Elf64_Phdr, PT_LOAD};
use linux_loader::loader::{elf::Elf, KernelLoader};
use vm_memory::{ByteValued, GuestAddress, GuestMemoryMmap};

use crate::layout;

/// Why a payload could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file cannot be opened.
    #[error("cannot open payload {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Not an ELF64 x86-64 executable.
    #[error("payload {path} is not a 64-bit x86 ELF executable ({why})")]
    NotElf { path: PathBuf, why: &'static str },
    /// A segment lies outside usable guest RAM.
    #[error("payload {path} does not fit guest memory: segment at {addr:#x} of {size} bytes must lie in {start:#x}..{end:#x}; give more --memory or relink the payload at 0x200000")]
    DoesNotFit {
        path: PathBuf,
        addr: u64,
        size: u64,
        start: u64,
        end: u64,
    },
    /// The ELF has nothing to load.
    #[error("payload {path} has no loadable segment")]
    Empty { path: PathBuf },
    /// linux-loader refused it.
    #[error("cannot load payload {path}: {source}")]
    Loader {
        path: PathBuf,
        source: linux_loader::loader::Error,
    },
}

/// Where the payload landed.
#[derive(Debug, Clone, Copy)]
pub struct Loaded {
    pub entry: u64,
    pub end: u64,
}

/// Loads `path` into `mem`, whose low RAM region ends at `low_ram_end`.
pub fn load_payload(
    mem: &GuestMemoryMmap,
    path: &Path,
    low_ram_end: u64,
) -> Result<Loaded, LoadError> {
    let mut file = File::open(path).map_err(|source| LoadError::Open {
        path: path.into(),
        source,
    })?;
    validate(&mut file, path, low_ram_end)?;
    let result = Elf::load(
        mem,
        None,
        &mut file,
        Some(GuestAddress(layout::PAYLOAD_START)),
    )
    .map_err(|source| LoadError::Loader {
        path: path.into(),
        source,
    })?;
    Ok(Loaded {
        entry: result.kernel_load.0,
        end: result.kernel_end,
    })
}

fn validate(file: &mut File, path: &Path, low_ram_end: u64) -> Result<(), LoadError> {
    let not_elf = |why| LoadError::NotElf {
        path: path.into(),
        why,
    };
    let mut ehdr = Elf64_Ehdr::default();
    file.read_exact(ehdr.as_mut_slice())
        .map_err(|_| not_elf("shorter than an ELF header"))?;
    if ehdr.e_ident[..4] != *b"\x7fELF" {
        return Err(not_elf("bad magic"));
    }
    if ehdr.e_ident[4] != 2 || ehdr.e_ident[5] != 1 {
        return Err(not_elf("not ELF64 little endian"));
    }
    if ehdr.e_machine != 62 {
        return Err(not_elf("not x86-64"));
    }
    if ehdr.e_type != 2 {
        return Err(not_elf("not a static executable (ET_EXEC)"));
    }
    if usize::from(ehdr.e_phentsize) != std::mem::size_of::<Elf64_Phdr>() {
        return Err(not_elf("bad program header size"));
    }
    let fits = |addr: u64, size: u64| {
        addr >= layout::PAYLOAD_START
            && addr.checked_add(size).is_some_and(|end| end <= low_ram_end)
    };
    if !fits(ehdr.e_entry, 1) {
        return Err(LoadError::DoesNotFit {
            path: path.into(),
            addr: ehdr.e_entry,
            size: 1,
            start: layout::PAYLOAD_START,
            end: low_ram_end,
        });
    }
    file.seek(SeekFrom::Start(ehdr.e_phoff))
        .map_err(|_| not_elf("program headers past the end"))?;
    let mut loadable = 0;
    for _ in 0..ehdr.e_phnum {
        let mut ph = Elf64_Phdr::default();
        file.read_exact(ph.as_mut_slice())
            .map_err(|_| not_elf("truncated program headers"))?;
        if ph.p_type != PT_LOAD || ph.p_memsz == 0 {
            continue;
        }
        if ph.p_filesz > ph.p_memsz {
            return Err(not_elf("segment file size exceeds its memory size"));
        }
        if !fits(ph.p_paddr, ph.p_memsz) {
            return Err(LoadError::DoesNotFit {
                path: path.into(),
                addr: ph.p_paddr,
                size: ph.p_memsz,
                start: layout::PAYLOAD_START,
                end: low_ram_end,
            });
        }
        loadable += 1;
    }
    if loadable == 0 {
        return Err(LoadError::Empty { path: path.into() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::memory::create_guest_memory;

    fn elf(entry: u64, paddr: u64, memsz: u64, code: &[u8]) -> Vec<u8> {
        let mut eh = Elf64_Ehdr::default();
        eh.e_ident[..4].copy_from_slice(b"\x7fELF");
        eh.e_ident[4] = 2;
        eh.e_ident[5] = 1;
        eh.e_ident[6] = 1;
        eh.e_type = 2;
        eh.e_machine = 62;
        eh.e_version = 1;
        eh.e_entry = entry;
        eh.e_phoff = 64;
        eh.e_ehsize = 64;
        eh.e_phentsize = 56;
        eh.e_phnum = 1;
        let ph = Elf64_Phdr {
            p_type: PT_LOAD,
            p_flags: 5,
            p_offset: 120,
            p_vaddr: paddr,
            p_paddr: paddr,
            p_filesz: code.len() as u64,
            p_memsz: memsz,
            p_align: 0x1000,
        };
        let mut out = eh.as_slice().to_vec();
        out.extend_from_slice(ph.as_slice());
        out.extend_from_slice(code);
        out
    }

    fn write_tmp(name: &str, bytes: &[u8]) -> PathBuf {
        let p = std::env::temp_dir().join(format!("vmm-loader-{}-{name}", std::process::id()));
        std::fs::File::create(&p).unwrap().write_all(bytes).unwrap();
        p
    }

    #[test]
    fn loads_a_valid_image() {
        let mem = create_guest_memory(8 << 20).unwrap();
        let p = write_tmp("ok", &elf(0x20_0000, 0x20_0000, 0x2000, &[0xf4; 16]));
        let l = load_payload(&mem, &p, 8 << 20).unwrap();
        assert_eq!(l.entry, 0x20_0000);
        assert_eq!(l.end, 0x20_2000);
    }

    #[test]
    fn rejects_bad_images() {
        let mem = create_guest_memory(8 << 20).unwrap();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("empty", vec![]),
            (
                "garbage",
                b"this is not an elf file at all, not even close..........................."
                    .to_vec(),
            ),
            ("low", elf(0x20_0000, 0x1000, 0x100, &[0; 4])),
            ("huge", elf(0x20_0000, 0x20_0000, 64 << 20, &[0; 4])),
            ("wrap", elf(0x20_0000, u64::MAX - 10, 100, &[0; 4])),
            ("entry", elf(0x10, 0x20_0000, 0x100, &[0; 4])),
        ];
        for (name, bytes) in cases {
            let p = write_tmp(name, &bytes);
            let err = load_payload(&mem, &p, 8 << 20).expect_err(name);
            let _ = std::fs::remove_file(&p);
            assert!(!err.to_string().is_empty());
        }
        assert!(matches!(
            load_payload(&mem, Path::new("/nonexistent/payload"), 8 << 20),
            Err(LoadError::Open { .. })
        ));
    }
}
