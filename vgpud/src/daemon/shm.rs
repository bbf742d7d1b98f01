//! The shared device memory registry (Gdev §4's shm, across worker processes): objects
//! keyed per GPU and share group, reference counted by attachment, each backed by a file
//! descriptor vgpud holds and hands to every mapper (sim: a memfd).
//!
//! Invariant 4 of DESIGN.md lives here: only vGPUs of the object's share group on the
//! object's GPU can look it up or attach it, and an object is freed only when it was
//! removed (RMID) and its last attachment is gone, or when no vGPU of its group is left.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use vgpu_proto::args::{shm_cmd, shm_flags};

use crate::control::ShmFailure;

/// A shared object for a sim GPU: a memfd of `size` bytes (page-rounded) with its memory
/// committed, so running out of host memory is an error here and never a SIGBUS in a
/// mapper later. The sim backend maps it as device memory (`Backend::import_shared`).
pub fn sim_object(size: u64) -> Result<OwnedFd, String> {
    const PAGE: u64 = 4096;
    let len = size
        .checked_add(PAGE - 1)
        .map(|l| l & !(PAGE - 1))
        .filter(|l| *l > 0)
        .and_then(|l| libc::off_t::try_from(l).ok())
        .ok_or_else(|| format!("a shared object of {size} bytes cannot be created"))?;
    // SAFETY: memfd_create with a valid NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(c"vgpu-shm".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a fresh descriptor we own and nothing else refers to.
    let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain syscalls on our own descriptor.
    if unsafe { libc::ftruncate(memfd.as_raw_fd(), len) } != 0 {
        return Err(format!(
            "sizing the object: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: as above.
    if unsafe { libc::fallocate(memfd.as_raw_fd(), 0, 0, len) } != 0 {
        return Err(format!(
            "committing {len} bytes of host memory for the object: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(memfd)
}

/// Who asks.
#[derive(Clone, Debug)]
pub struct Asker<'a> {
    /// The vGPU.
    pub vgpu: u32,
    /// Its GPU.
    pub gpu: u32,
    /// Its share group, if the operator put it in one.
    pub group: Option<&'a str>,
}

/// One shared object.
#[derive(Debug)]
pub struct Object {
    pub id: u64,
    pub key: u64,
    pub size: u64,
    pub gpu: u32,
    pub group: String,
    pub creator: u32,
    fd: OwnedFd,
    /// Attachments per vGPU.
    pub attached: BTreeMap<u32, u32>,
    /// RMID was asked: freed at the last detach.
    pub removed: bool,
}

impl Object {
    /// Attachments across vGPUs.
    pub fn attachments(&self) -> u64 {
        self.attached.values().map(|n| u64::from(*n)).sum()
    }
}

type Fail = (ShmFailure, String);

/// Every shared object of the host.
#[derive(Debug, Default)]
pub struct Registry {
    next: u64,
    objects: BTreeMap<u64, Object>,
}

/// Largest shared object (a sanity bound; the GPU's free memory is the real limit).
pub const MAX_SIZE: u64 = 1 << 40;

impl Registry {
    fn group<'a>(who: &Asker<'a>) -> Result<&'a str, Fail> {
        who.group.ok_or_else(|| {
            (
                ShmFailure::Denied,
                format!(
                    "vGPU {} is in no share group; the operator puts vGPUs that share memory in one (share_group at creation)",
                    who.vgpu
                ),
            )
        })
    }

    fn visible(&self, who: &Asker<'_>, id: u64) -> Result<&Object, Fail> {
        let group = Self::group(who)?;
        let o = self
            .objects
            .get(&id)
            .ok_or_else(|| (ShmFailure::NotFound, format!("id {id}")))?;
        if o.gpu != who.gpu || o.group != group {
            return Err((
                ShmFailure::Denied,
                format!(
                    "shared object {id} belongs to another share group or GPU than vGPU {}",
                    who.vgpu
                ),
            ));
        }
        Ok(o)
    }

    /// `shmget`. `free` is the device memory the GPU has left for a new object;
    /// `create` makes the object's backing (sim: a memfd).
    pub fn get(
        &mut self,
        who: &Asker<'_>,
        key: u64,
        size: u64,
        flags: u64,
        free: u64,
        create: impl FnOnce(u64) -> Result<OwnedFd, String>,
    ) -> Result<u64, Fail> {
        let group = Self::group(who)?;
        let existing = (key != 0)
            .then(|| {
                self.objects
                    .values()
                    .find(|o| o.key == key && o.gpu == who.gpu && o.group == group && !o.removed)
            })
            .flatten();
        if let Some(o) = existing {
            if flags & shm_flags::CREATE != 0 && flags & shm_flags::EXCLUSIVE != 0 {
                return Err((
                    ShmFailure::Exists,
                    format!("key {key:#x} exists already (CREATE|EXCLUSIVE); use another key or drop EXCLUSIVE"),
                ));
            }
            if size > o.size {
                return Err((
                    ShmFailure::Invalid,
                    format!(
                        "key {key:#x} holds {} bytes, fewer than the {size} asked; ask for at most its size (0 looks it up)",
                        o.size
                    ),
                ));
            }
            return Ok(o.id);
        }
        if flags & shm_flags::CREATE == 0 {
            return Err((
                ShmFailure::NotFound,
                format!("key {key:#x} in share group {group:?}; pass CREATE to make it"),
            ));
        }
        if size == 0 || size > MAX_SIZE {
            return Err((
                ShmFailure::Invalid,
                format!("size {size}: give 1 byte to {MAX_SIZE} bytes"),
            ));
        }
        if size > free {
            return Err((
                ShmFailure::NoMemory,
                format!(
                    "{size} bytes asked, GPU {} has {free} bytes free for shared objects",
                    who.gpu
                ),
            ));
        }
        let fd = create(size).map_err(|e| (ShmFailure::NoMemory, e))?;
        self.next += 1;
        let id = self.next;
        self.objects.insert(
            id,
            Object {
                id,
                key,
                size,
                gpu: who.gpu,
                group: group.to_string(),
                creator: who.vgpu,
                fd,
                attached: BTreeMap::new(),
                removed: false,
            },
        );
        tracing::info!(
            shm = id,
            key,
            size,
            gpu = who.gpu,
            group,
            vgpu = who.vgpu,
            "shared object created"
        );
        Ok(id)
    }

    /// `shmat`: a descriptor of the object for the mapper, and its size.
    pub fn attach(&mut self, who: &Asker<'_>, id: u64) -> Result<(OwnedFd, u64), Fail> {
        let o = self.visible(who, id)?;
        if o.removed {
            return Err((
                ShmFailure::NotFound,
                format!("shared object {id} was removed (RMID)"),
            ));
        }
        let fd = o.fd.try_clone().map_err(|e| {
            (
                ShmFailure::NoMemory,
                format!("duplicating the object's descriptor: {e}"),
            )
        })?;
        let size = o.size;
        if let Some(o) = self.objects.get_mut(&id) {
            *o.attached.entry(who.vgpu).or_default() += 1;
        }
        Ok((fd, size))
    }

    /// One attachment of `id` by `vgpu` fewer.
    pub fn detach(&mut self, vgpu: u32, id: u64) -> Result<(), Fail> {
        let o = self
            .objects
            .get_mut(&id)
            .ok_or_else(|| (ShmFailure::NotFound, format!("id {id}")))?;
        match o.attached.get_mut(&vgpu) {
            Some(n) if *n > 1 => *n -= 1,
            Some(_) => {
                o.attached.remove(&vgpu);
            }
            None => {
                return Err((
                    ShmFailure::NotFound,
                    format!("vGPU {vgpu} has no attachment of shared object {id}"),
                ))
            }
        }
        self.reap(id);
        Ok(())
    }

    /// `shmctl`.
    pub fn ctl(&mut self, who: &Asker<'_>, id: u64, cmd: u32) -> Result<[u64; 4], Fail> {
        let o = self.visible(who, id)?;
        match cmd {
            shm_cmd::STAT => Ok([o.size, o.attachments(), o.key, 0]),
            shm_cmd::RMID => {
                if let Some(o) = self.objects.get_mut(&id) {
                    o.removed = true;
                }
                self.reap(id);
                Ok([0; 4])
            }
            other => Err((
                ShmFailure::Invalid,
                format!("command {other}: use RMID (0) or STAT (1)"),
            )),
        }
    }

    /// vGPU `vgpu` is gone: its attachments go; objects of a group with no vGPU left on
    /// the GPU go too (`group_alive` says whether any vGPU of a group remains there).
    pub fn vgpu_gone(&mut self, vgpu: u32, group_alive: impl Fn(u32, &str) -> bool) {
        let ids: Vec<u64> = self.objects.keys().copied().collect();
        for id in ids {
            if let Some(o) = self.objects.get_mut(&id) {
                o.attached.remove(&vgpu);
                if !group_alive(o.gpu, &o.group) {
                    o.removed = true;
                }
            }
            self.reap(id);
        }
    }

    fn reap(&mut self, id: u64) {
        if self
            .objects
            .get(&id)
            .is_some_and(|o| o.removed && o.attached.is_empty())
        {
            if let Some(o) = self.objects.remove(&id) {
                tracing::info!(shm = id, key = o.key, size = o.size, "shared object freed");
            }
        }
    }

    /// Bytes of shared objects on `gpu`.
    pub fn bytes_on(&self, gpu: u32) -> u64 {
        self.objects
            .values()
            .filter(|o| o.gpu == gpu)
            .map(|o| o.size)
            .sum()
    }

    /// Every object.
    pub fn objects(&self) -> impl Iterator<Item = &Object> {
        self.objects.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memfd(size: u64) -> Result<OwnedFd, String> {
        sim_object(size)
    }

    fn who(vgpu: u32, group: Option<&str>) -> Asker<'_> {
        Asker {
            vgpu,
            gpu: 0,
            group,
        }
    }

    #[test]
    fn create_lookup_attach_and_free_on_last_detach() {
        let mut r = Registry::default();
        let a = who(1, Some("g"));
        let b = who(2, Some("g"));
        let c = CREATE_FLAGS;
        let id = r.get(&a, 7, 4096, c, 1 << 20, memfd).expect("create");
        assert_eq!(r.get(&b, 7, 0, 0, 1 << 20, memfd), Ok(id), "lookup by key");
        assert_eq!(
            r.get(&b, 7, 4096, c | shm_flags::EXCLUSIVE, 1 << 20, memfd)
                .map_err(|e| e.0),
            Err(ShmFailure::Exists)
        );
        let (_fd, size) = r.attach(&a, id).expect("attach a");
        assert_eq!(size, 4096);
        r.attach(&b, id).expect("attach b");
        assert_eq!(r.ctl(&a, id, shm_cmd::STAT), Ok([4096, 2, 7, 0]));
        r.ctl(&a, id, shm_cmd::RMID).expect("rmid while attached");
        assert!(r.objects().any(|o| o.id == id), "kept while attached");
        assert!(r.attach(&a, id).is_err(), "no new attachments after RMID");
        r.detach(1, id).expect("detach a");
        assert!(r.objects().any(|o| o.id == id));
        r.detach(2, id).expect("detach b");
        assert!(r.objects().next().is_none(), "freed on the last detach");
    }

    const CREATE_FLAGS: u64 = shm_flags::CREATE;

    #[test]
    fn other_groups_and_groupless_vgpus_are_denied() {
        let mut r = Registry::default();
        let id = r
            .get(&who(1, Some("g")), 7, 4096, CREATE_FLAGS, 1 << 20, memfd)
            .expect("create");
        let other = who(2, Some("h"));
        assert_eq!(
            r.attach(&other, id).map(|_| ()).map_err(|e| e.0),
            Err(ShmFailure::Denied)
        );
        assert_eq!(
            r.ctl(&other, id, shm_cmd::RMID).map_err(|e| e.0),
            Err(ShmFailure::Denied)
        );
        assert_eq!(
            r.get(&other, 7, 0, 0, 1 << 20, memfd).map_err(|e| e.0),
            Err(ShmFailure::NotFound),
            "keys are scoped by share group"
        );
        assert_eq!(
            r.get(&who(3, None), 7, 0, 0, 1 << 20, memfd)
                .map_err(|e| e.0),
            Err(ShmFailure::Denied)
        );
        let mut other_gpu = who(4, Some("g"));
        other_gpu.gpu = 1;
        assert_eq!(
            r.attach(&other_gpu, id).map(|_| ()).map_err(|e| e.0),
            Err(ShmFailure::Denied)
        );
    }

    #[test]
    fn bad_sizes_and_commands_fail() {
        let mut r = Registry::default();
        let a = who(1, Some("g"));
        for size in [0, MAX_SIZE + 1] {
            assert_eq!(
                r.get(&a, 1, size, CREATE_FLAGS, u64::MAX, memfd)
                    .map_err(|e| e.0),
                Err(ShmFailure::Invalid)
            );
        }
        assert_eq!(
            r.get(&a, 1, 1 << 30, CREATE_FLAGS, 1 << 20, memfd)
                .map_err(|e| e.0),
            Err(ShmFailure::NoMemory)
        );
        let id = r
            .get(&a, 1, 4096, CREATE_FLAGS, 1 << 20, memfd)
            .expect("create");
        assert_eq!(
            r.get(&a, 1, 8192, 0, 1 << 20, memfd).map_err(|e| e.0),
            Err(ShmFailure::Invalid)
        );
        assert_eq!(r.ctl(&a, id, 9).map_err(|e| e.0), Err(ShmFailure::Invalid));
        assert_eq!(r.detach(1, id).map_err(|e| e.0), Err(ShmFailure::NotFound));
        assert_eq!(r.detach(1, 999).map_err(|e| e.0), Err(ShmFailure::NotFound));
    }

    #[test]
    fn a_dying_vgpu_leaves_the_object_to_the_others() {
        let mut r = Registry::default();
        let a = who(1, Some("g"));
        let b = who(2, Some("g"));
        let id = r
            .get(&a, 7, 4096, CREATE_FLAGS, 1 << 20, memfd)
            .expect("create");
        r.attach(&a, id).expect("a");
        r.attach(&b, id).expect("b");
        r.vgpu_gone(1, |_, _| true);
        assert_eq!(r.ctl(&b, id, shm_cmd::STAT), Ok([4096, 1, 7, 0]));
        r.vgpu_gone(2, |_, _| false);
        assert!(
            r.objects().next().is_none(),
            "no vGPU of the group left: freed"
        );
    }
}
