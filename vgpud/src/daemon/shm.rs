//! The shared device memory registry (Gdev §4's shm, across worker processes): objects
//! keyed per GPU and share group, reference counted by attachment, each backed by a file
//! descriptor vgpud holds and hands to every mapper. The worker of the vGPU that creates
//! an object makes it on its GPU and hands vgpud the descriptor (sim: a sealed memfd;
//! cuda: an exported allocation), so vgpud never loads a GPU driver.
//!
//! Invariant 4 of docs/architecture.md lives here: only vGPUs of the object's share group on the
//! object's GPU can look it up or attach it, and an object is freed only when it was
//! removed (RMID) and its last attachment is gone, or when no vGPU of its group is left.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};

use vgpu_proto::args::{shm_cmd, shm_flags};

use crate::control::ShmFailure;

/// Checks a descriptor a worker handed in as a new object of `size` bytes (it created
/// and exported it on its GPU, `SharedMemory::export`). On a sim GPU it must be a memfd
/// of at least the object's whole pages, sealed against shrinking (so no holder can cut
/// it under another mapper). On a cuda GPU the descriptor is the driver's (only the
/// driver can tell what it holds): a socket, directory or pipe is refused, and anything
/// else that is no exported allocation of that size fails the mappers' import
/// (`cuMemImportFromShareableHandle`, `cuMemMap`). Either way a wrong descriptor reaches
/// only the vGPUs of the worker's own share group on its own GPU.
pub fn check_object(fd: &OwnedFd, size: u64, sim: bool) -> Result<(), String> {
    // SAFETY: an all-zero stat is a valid out-buffer for fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat only writes to `st`; the descriptor is ours and open.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(format!(
            "the worker's shared object descriptor cannot be inspected: {}",
            std::io::Error::last_os_error()
        ));
    }
    let kind = st.st_mode & libc::S_IFMT;
    if matches!(kind, libc::S_IFSOCK | libc::S_IFDIR | libc::S_IFIFO) {
        return Err(format!(
            "the worker handed a socket, directory or pipe (mode {:o}) as a shared object",
            st.st_mode
        ));
    }
    if !sim {
        return Ok(());
    }
    let len = u64::try_from(st.st_size).unwrap_or(0);
    // SAFETY: plain fcntl on our own descriptor; it reads nothing from us.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    let sealed = seals >= 0 && seals & libc::F_SEAL_SHRINK != 0;
    if kind != libc::S_IFREG || len < charged_bytes(size) || !sealed {
        return Err(format!(
            "the worker's shared object is not a memfd of {} bytes sealed against shrinking (mode {:o}, {len} bytes, seals {seals:#x})",
            charged_bytes(size),
            st.st_mode
        ));
    }
    Ok(())
}

/// Bounds on what guests make through the registry. Every object holds a descriptor in
/// vgpud (and one per attachment in the mapping worker), so without them a guest that
/// loops over `SHM_GET` with key 0 exhausts vgpud's descriptors and every other tenant's
/// REST calls fail. Past a bound the guest gets `OUT_OF_MEMORY` with the reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Live objects one vGPU created (removed ones still attached count: they hold a
    /// descriptor) (`vgpud --shm-objects-per-vgpu`).
    pub objects_per_vgpu: usize,
    /// Live objects of one share group on one GPU (`--shm-objects-per-group`).
    pub objects_per_group: usize,
    /// Attachments one vGPU holds at once, across objects (each is a mapping and a
    /// descriptor in its worker) (`--shm-attachments-per-vgpu`).
    pub attachments_per_vgpu: u64,
    /// Descriptors vgpud keeps free for everything else (REST connections, worker
    /// sockets, logs, grant channels): an object or attachment that would leave fewer is
    /// refused, long before `EMFILE`.
    pub fd_reserve: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            objects_per_vgpu: 64,
            objects_per_group: 256,
            attachments_per_vgpu: 256,
            fd_reserve: FD_RESERVE,
        }
    }
}

/// The default of [`Limits::fd_reserve`].
pub const FD_RESERVE: u64 = 512;

/// Bytes an object of `size` bytes takes: whole pages, as its backing is made.
pub fn charged_bytes(size: u64) -> u64 {
    const PAGE: u64 = 4096;
    size.div_ceil(PAGE).saturating_mul(PAGE)
}

/// Raises vgpud's open-file limit (`RLIMIT_NOFILE`) to its hard limit: every shared
/// object, worker channel and REST connection is a descriptor. Returns the soft limit
/// now in force.
pub fn raise_fd_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes into `lim`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "reading RLIMIT_NOFILE");
        return 0;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads `raised`; raising the soft limit to the hard one is
        // always permitted.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim = raised;
        } else {
            tracing::warn!(error = %std::io::Error::last_os_error(), "raising RLIMIT_NOFILE");
        }
    }
    tracing::info!(open_files = lim.rlim_cur, "open-file limit");
    lim.rlim_cur
}

/// Descriptors this process may still open: the soft `RLIMIT_NOFILE` less those open
/// now (`None` when either cannot be read).
pub fn fd_headroom() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes into `lim`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    let open = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    Some(lim.rlim_cur.saturating_sub(open))
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
#[derive(Debug)]
pub struct Registry {
    next: u64,
    objects: BTreeMap<u64, Object>,
    limits: Limits,
    /// Descriptors vgpud may still open (replaceable in tests).
    headroom: fn() -> Option<u64>,
}

impl Default for Registry {
    fn default() -> Self {
        Self::new(Limits::default())
    }
}

/// Largest shared object (a sanity bound; the GPU's free memory is the real limit).
pub const MAX_SIZE: u64 = 1 << 40;

impl Registry {
    /// An empty registry with these bounds.
    pub fn new(limits: Limits) -> Self {
        Self {
            next: 0,
            objects: BTreeMap::new(),
            limits,
            headroom: fd_headroom,
        }
    }

    /// Refuses a new descriptor when fewer than the reserve would be left.
    fn check_descriptors(&self, what: &str) -> Result<(), Fail> {
        match (self.headroom)() {
            Some(left) if left <= self.limits.fd_reserve => {
                tracing::warn!(
                    left,
                    reserve = self.limits.fd_reserve,
                    "shared memory refused: vgpud is short of file descriptors"
                );
                Err((
                    ShmFailure::NoMemory,
                    format!(
                        "{what} refused: vgpud has {left} file descriptors left, and keeps {} for its other work; detach or remove (RMID) shared objects, or ask the operator to raise vgpud's open-file limit",
                        self.limits.fd_reserve
                    ),
                ))
            }
            _ => Ok(()),
        }
    }

    /// Refuses a new object of `who` past the per-vGPU or per-group bound.
    fn check_object_bounds(&self, who: &Asker<'_>, group: &str) -> Result<(), Fail> {
        let mine = self
            .objects
            .values()
            .filter(|o| o.creator == who.vgpu)
            .count();
        if mine >= self.limits.objects_per_vgpu {
            return Err((
                ShmFailure::NoMemory,
                format!(
                    "vGPU {} has created {mine} shared objects, the most one vGPU may hold; remove some (SHM_CTL RMID, then detach) first",
                    who.vgpu
                ),
            ));
        }
        let in_group = self
            .objects
            .values()
            .filter(|o| o.gpu == who.gpu && o.group == group)
            .count();
        if in_group >= self.limits.objects_per_group {
            return Err((
                ShmFailure::NoMemory,
                format!(
                    "share group {group:?} holds {in_group} shared objects on GPU {}, the most a group may hold; remove some (SHM_CTL RMID, then detach) first",
                    who.gpu
                ),
            ));
        }
        self.check_descriptors("a new shared object")
    }

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

    /// `shmget` up to the creation: `Ok(Some(id))` when the key names an object the asker
    /// may use, `Ok(None)` when a new object of `size` bytes is to be made (every check
    /// passed: flags, size, `free` device memory on the GPU, bounds), else why not.
    pub fn prepare(
        &self,
        who: &Asker<'_>,
        key: u64,
        size: u64,
        flags: u64,
        free: u64,
    ) -> Result<Option<u64>, Fail> {
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
            return Ok(Some(o.id));
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
        if charged_bytes(size) > free {
            return Err((
                ShmFailure::NoMemory,
                format!(
                    "{size} bytes asked ({} in whole pages), GPU {} has {free} bytes free for shared objects",
                    charged_bytes(size),
                    who.gpu
                ),
            ));
        }
        self.check_object_bounds(who, group)?;
        Ok(None)
    }

    /// `shmget` with the new object's backing made by `create` (a test's memfd): what
    /// [`Registry::prepare`] then [`Registry::insert`] do for a worker's object.
    #[cfg(test)]
    pub fn get(
        &mut self,
        who: &Asker<'_>,
        key: u64,
        size: u64,
        flags: u64,
        free: u64,
        create: impl FnOnce(u64) -> Result<OwnedFd, String>,
    ) -> Result<u64, Fail> {
        if let Some(id) = self.prepare(who, key, size, flags, free)? {
            return Ok(id);
        }
        let fd = create(size).map_err(|e| (ShmFailure::NoMemory, e))?;
        self.insert(who, key, size, fd)
    }

    /// Registers a new object (`fd`, `size` bytes) after [`Registry::prepare`] said to make
    /// it; the caller held the registry since.
    pub fn insert(
        &mut self,
        who: &Asker<'_>,
        key: u64,
        size: u64,
        fd: OwnedFd,
    ) -> Result<u64, Fail> {
        let group = Self::group(who)?;
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
        let held: u64 = self
            .objects
            .values()
            .filter_map(|o| o.attached.get(&who.vgpu))
            .map(|n| u64::from(*n))
            .sum();
        if held >= self.limits.attachments_per_vgpu {
            return Err((
                ShmFailure::NoMemory,
                format!(
                    "vGPU {} holds {held} shared memory attachments, the most one vGPU may hold; detach some (SHM_DT) first",
                    who.vgpu
                ),
            ));
        }
        self.check_descriptors("a new attachment")?;
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

    /// Bytes of shared objects on `gpu`, each in whole pages.
    pub fn bytes_on(&self, gpu: u32) -> u64 {
        self.objects
            .values()
            .filter(|o| o.gpu == gpu)
            .map(|o| charged_bytes(o.size))
            .sum()
    }

    /// Every object.
    pub fn objects(&self) -> impl Iterator<Item = &Object> {
        self.objects.values()
    }

    /// The objects `vgpu` has attached (ids, ascending): what pins it to its GPU.
    pub fn mapped_by(&self, vgpu: u32) -> Vec<u64> {
        self.objects
            .values()
            .filter(|o| o.attached.contains_key(&vgpu))
            .map(|o| o.id)
            .collect()
    }
}

#[cfg(test)]
mod tests;
