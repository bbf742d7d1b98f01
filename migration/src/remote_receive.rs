//! The destination end of a move to another host (`remote.rs`): the stream read and
//! checked, the vGPU's allocations, modules and functions rebuilt at their addresses.

use super::*;

/// What a destination received.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Received {
    pub allocations: usize,
    pub bytes: u64,
    pub modules: usize,
    pub functions: usize,
    /// Module variables whose bytes arrived.
    pub variables: usize,
}

impl Migratable {
    /// Receives a vGPU's state from a source worker over `conn` into this fresh vGPU;
    /// `token` is the one-time secret the source must present. Dispatch is held from the
    /// start (`on_locked` runs once it is): the guest's requests wait until the state is
    /// in place. On any failure everything placed is freed again and the source hears why.
    pub fn receive_from<S: Read + Write>(
        &self,
        conn: S,
        token: &[u8],
        on_locked: impl FnOnce(),
    ) -> Result<Received, MigrationError> {
        self.receive_into(conn, token, None, on_locked)
    }

    /// As [`Migratable::receive_from`], for an oversubscribed vGPU when `pager` is the
    /// pager above this migratable layer: every allocation placed becomes the pager's own
    /// (charged to its share and its broker's reservation, evictable once the state is
    /// in place).
    pub fn receive_into<S: Read + Write>(
        &self,
        mut conn: S,
        token: &[u8],
        pager: Option<&Pager>,
        on_locked: impl FnOnce(),
    ) -> Result<Received, MigrationError> {
        let held = write(&self.dispatch);
        on_locked();
        let mut rx = Receiver {
            m: self,
            pager,
            got: Received::default(),
            placed: BTreeSet::new(),
            loaded: BTreeMap::new(),
            vars: Default::default(),
        };
        let r = rx.run(&mut conn, token);
        match &r {
            Ok(_) => {
                if let Err(e) = Message::Ack.write(&mut conn) {
                    rx.undo();
                    drop(held);
                    return Err(wire(e));
                }
                rx.commit();
            }
            Err(e) => {
                tracing::warn!(error = %e, "refused the incoming vGPU state");
                let _ = Message::Error {
                    reason: &e.to_string(),
                }
                .write(&mut conn);
                rx.undo();
            }
        }
        drop(held);
        r.map(|()| rx.got)
    }
}

struct Receiver<'m> {
    m: &'m Migratable,
    pager: Option<&'m Pager>,
    got: Received,
    /// Allocations placed on the backend (addr -> size).
    placed: BTreeSet<u64>,
    /// Modules loaded: guest handle -> (real handle, image).
    loaded: BTreeMap<u64, (u64, Image)>,
    /// Module variables received, by the guest's address.
    vars: crate::globals::Received,
}

impl Receiver<'_> {
    fn bad(why: impl Into<String>) -> MigrationError {
        MigrationError::Stream(why.into())
    }

    fn run(&mut self, conn: &mut impl Read, token: &[u8]) -> Result<(), MigrationError> {
        if !lock(&self.m.allocs).is_empty() || !lock(&self.m.modules).is_empty() {
            return Err(Self::bad(
                "this vGPU is in use already; incoming state needs a fresh one",
            ));
        }
        let backend = self.m.current();
        let (va_base, va_size) = (self.m.info.va_base, self.m.info.va_size);
        let va_end = va_base.saturating_add(va_size);
        let mut buf = Vec::new();
        match read_message(conn, &mut buf).map_err(wire)? {
            Message::Hello {
                token: t,
                va_base: b,
                va_size: s,
            } => {
                if !same_token(t, token) {
                    return Err(MigrationError::Refused(
                        "the source presented a wrong token".into(),
                    ));
                }
                if (b, s) != (va_base, va_size) {
                    return Err(Self::bad(format!(
                        "the source's address range {b:#x}+{s:#x} differs from this vGPU's {va_base:#x}+{va_size:#x}"
                    )));
                }
            }
            Message::Error { reason } => return Err(MigrationError::Refused(reason.into())),
            _ => return Err(Self::bad("the stream does not start with a hello")),
        }
        let mut sizes: BTreeMap<u64, u64> = BTreeMap::new();
        let mut functions: BTreeMap<u64, Func> = BTreeMap::new();
        let mut scratch = Vec::new();
        loop {
            match read_message(conn, &mut buf).map_err(wire)? {
                Message::Alloc { addr, size } => {
                    let end = addr
                        .checked_add(size)
                        .ok_or_else(|| Self::bad("allocation overflows"))?;
                    if size == 0 || addr < va_base || end > va_end {
                        return Err(Self::bad(format!(
                            "allocation {addr:#x}+{size:#x} lies outside the vGPU's range {va_base:#x}..{va_end:#x}"
                        )));
                    }
                    if sizes.contains_key(&addr) || sizes.len() >= MAX_ALLOCS {
                        return Err(Self::bad(format!(
                            "allocation {addr:#x} repeated or too many"
                        )));
                    }
                    let placed = require_relocation(&*backend)
                        .and_then(|r| r.alloc_at(addr, size))
                        .map_err(|source| MigrationError::Target {
                            what: format!("placing {size} bytes at {addr:#x}"),
                            source,
                        })?;
                    if let Some(p) = self.pager {
                        if let Err(source) = p.adopt(addr, size, placed.charged) {
                            let _ = backend.free(addr);
                            return Err(MigrationError::Target {
                                what: format!("charging {size} bytes at {addr:#x}"),
                                source,
                            });
                        }
                    }
                    self.placed.insert(addr);
                    sizes.insert(addr, size);
                }
                Message::Free { addr } => {
                    if sizes.remove(&addr).is_none() {
                        return Err(Self::bad(format!("free of unknown allocation {addr:#x}")));
                    }
                    self.placed.remove(&addr);
                    if let Some(p) = self.pager {
                        p.disown(addr);
                    }
                    let _ = backend.free(addr);
                }
                Message::Data {
                    addr,
                    offset,
                    bytes,
                } => {
                    let size = *sizes.get(&addr).ok_or_else(|| {
                        Self::bad(format!("bytes for unknown allocation {addr:#x}"))
                    })?;
                    let end = offset.checked_add(bytes.len() as u64);
                    if end.is_none_or(|e| e > size) {
                        return Err(Self::bad(format!(
                            "bytes at {addr:#x}+{offset:#x} run past the allocation's {size} bytes"
                        )));
                    }
                    scratch.clear();
                    scratch.extend_from_slice(bytes);
                    let slice = VolatileSlice::from(&mut scratch[..]);
                    backend.copy_htod(addr + offset, &slice).map_err(|source| {
                        MigrationError::Target {
                            what: format!("writing {addr:#x}+{offset:#x}"),
                            source,
                        }
                    })?;
                    self.got.bytes += bytes.len() as u64;
                }
                Message::Module {
                    handle,
                    kind,
                    image,
                } => {
                    if handle == 0
                        || self.loaded.contains_key(&handle)
                        || self.loaded.len() >= MAX_MODULES
                    {
                        return Err(Self::bad(format!(
                            "module handle {handle} repeated, zero or too many"
                        )));
                    }
                    let image = match kind {
                        ImageKind::Builtin => Image::Builtin(image.to_vec()),
                        ImageKind::Ptx => Image::Ptx(image.to_vec()),
                        ImageKind::Binary => Image::Binary(image.to_vec()),
                    };
                    let real =
                        backend
                            .modules()
                            .module_load(image.as_module())
                            .map_err(|source| MigrationError::Target {
                                what: format!("loading module {handle}"),
                                source,
                            })?;
                    self.loaded.insert(handle, (real, image));
                }
                Message::Function {
                    handle,
                    module,
                    name,
                } => {
                    let real_module =
                        self.loaded.get(&module).map(|l| l.0).ok_or_else(|| {
                            Self::bad(format!("function of unknown module {module}"))
                        })?;
                    if handle == 0
                        || functions.contains_key(&handle)
                        || self.loaded.contains_key(&handle)
                        || functions.len() >= MAX_FUNCTIONS
                    {
                        return Err(Self::bad(format!(
                            "function handle {handle} repeated, zero or too many"
                        )));
                    }
                    let f =
                        backend
                            .modules()
                            .get_function(real_module, name)
                            .map_err(|source| MigrationError::Target {
                                what: format!("looking up function {handle}"),
                                source,
                            })?;
                    functions.insert(
                        handle,
                        Func {
                            module,
                            name: name.to_vec(),
                            real: f.handle,
                        },
                    );
                }
                Message::Variable {
                    module,
                    addr,
                    size,
                    offset,
                    name,
                    bytes,
                } => {
                    let loaded = &self.loaded;
                    self.got.bytes += crate::globals::receive_var(
                        &*backend,
                        |h| loaded.get(&h).map(|l| l.0),
                        &mut self.vars,
                        &mut scratch,
                        crate::globals::Incoming {
                            module,
                            addr,
                            size,
                            offset,
                            name,
                            bytes,
                        },
                    )?;
                }
                Message::Done { next_handle } => {
                    crate::globals::check_apart(&self.vars, &sizes)?;
                    let highest = self
                        .loaded
                        .keys()
                        .chain(functions.keys())
                        .max()
                        .copied()
                        .unwrap_or(0);
                    if next_handle <= highest {
                        return Err(Self::bad("the next handle is not above every handle sent"));
                    }
                    let epoch = self.m.epoch.load(Ordering::Acquire);
                    let mut allocs = lock(&self.m.allocs);
                    for (addr, size) in &sizes {
                        allocs.insert(
                            *addr,
                            Alloc {
                                size: *size,
                                written: std::sync::Arc::new(epoch.into()),
                                decommitted: Default::default(),
                            },
                        );
                    }
                    drop(allocs);
                    self.got.allocations = sizes.len();
                    self.got.modules = self.loaded.len();
                    self.got.functions = functions.len();
                    self.got.variables = self.vars.len();
                    *lock(&self.m.functions) = functions;
                    self.m.next_handle.fetch_max(next_handle, Ordering::Relaxed);
                    return Ok(());
                }
                Message::Error { reason } => return Err(MigrationError::Refused(reason.into())),
                Message::Hello { .. } | Message::Ack => {
                    return Err(Self::bad("unexpected message in the vGPU stream"))
                }
            }
        }
    }

    /// The received state becomes the vGPU's.
    fn commit(&mut self) {
        let mut modules = lock(&self.m.modules);
        for (h, (real, image)) in std::mem::take(&mut self.loaded) {
            modules.insert(h, Module { image, real });
        }
        drop(modules);
        let vars = self.vars.take();
        if let Some(p) = self.pager {
            for (addr, v) in &vars {
                if let Some(addr) = addr {
                    p.adopt_global(*addr, v.size, v.module);
                }
            }
        }
        self.m.moved_vars(&*self.m.current(), vars);
        self.placed.clear();
        if let Some(p) = self.pager {
            // In place and whole: the pager may evict from it as its broker asks.
            p.settle();
        }
    }

    /// Gives back everything placed or loaded.
    fn undo(&mut self) {
        let backend = self.m.current();
        for (_, (real, _)) in std::mem::take(&mut self.loaded) {
            let _ = backend.modules().module_unload(real);
        }
        for addr in std::mem::take(&mut self.placed) {
            if let Some(p) = self.pager {
                p.disown(addr);
            }
            let _ = backend.free(addr);
        }
        lock(&self.m.allocs).clear();
        lock(&self.m.functions).clear();
    }
}
