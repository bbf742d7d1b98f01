//! The fields of the identify data structures we use.

/// From Identify Controller (CNS 1).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ControllerInfo {
    pub vid: u16,
    pub serial: String,
    pub model: String,
    /// Maximum data transfer size in bytes (0 = no limit reported).
    pub max_transfer: u64,
    pub namespaces: u32,
}

/// From Identify Namespace (CNS 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NamespaceInfo {
    pub nsid: u32,
    /// Size in logical blocks.
    pub blocks: u64,
    pub block_size: u32,
}

impl NamespaceInfo {
    pub fn bytes(&self) -> u64 {
        self.blocks * self.block_size as u64
    }
}

fn ascii(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim().to_string()
}

impl ControllerInfo {
    pub fn parse(page: &[u8; 4096]) -> Self {
        let mdts = page[77];
        ControllerInfo {
            vid: u16::from_le_bytes([page[0], page[1]]),
            serial: ascii(&page[4..24]),
            model: ascii(&page[24..64]),
            max_transfer: if mdts == 0 {
                0
            } else {
                (super::PAGE_SIZE as u64) << mdts
            },
            namespaces: u32::from_le_bytes([page[516], page[517], page[518], page[519]]),
        }
    }

    /// Write the identify page a controller with these properties returns.
    pub fn encode(&self, page: &mut [u8; 4096]) {
        page.fill(0);
        page[0..2].copy_from_slice(&self.vid.to_le_bytes());
        put_ascii(&mut page[4..24], &self.serial);
        put_ascii(&mut page[24..64], &self.model);
        page[64..68].copy_from_slice(b"0.1 ");
        let mut mdts = 0u8;
        while self.max_transfer > 0 && ((super::PAGE_SIZE as u64) << mdts) < self.max_transfer {
            mdts += 1;
        }
        page[77] = mdts;
        page[512] = 0x66; // SQES: required and maximum 2^6
        page[513] = 0x44; // CQES: 2^4
        page[516..520].copy_from_slice(&self.namespaces.to_le_bytes());
    }
}

fn put_ascii(dst: &mut [u8], s: &str) {
    dst.fill(b' ');
    for (d, c) in dst.iter_mut().zip(s.bytes()) {
        *d = c;
    }
}

impl NamespaceInfo {
    pub fn parse(nsid: u32, page: &[u8; 4096]) -> Self {
        let nsze = u64::from_le_bytes(page[0..8].try_into().unwrap_or([0; 8]));
        let flbas = (page[26] & 0xf) as usize;
        let lbaf = 128 + 4 * flbas;
        let lbads = page.get(lbaf + 2).copied().unwrap_or(9);
        NamespaceInfo {
            nsid,
            blocks: nsze,
            block_size: 1u32.checked_shl(lbads as u32).unwrap_or(512),
        }
    }

    pub fn encode(&self, page: &mut [u8; 4096]) {
        page.fill(0);
        for off in [0, 8, 16] {
            page[off..off + 8].copy_from_slice(&self.blocks.to_le_bytes());
        }
        page[25] = 0; // one LBA format
        page[26] = 0; // using format 0
        page[128 + 2] = self.block_size.trailing_zeros() as u8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identify_pages_round_trip() {
        let c = ControllerInfo {
            vid: 0x1b36,
            serial: "SN1".into(),
            model: "vgpu emulated".into(),
            max_transfer: 8192,
            namespaces: 1,
        };
        let mut p = [0u8; 4096];
        c.encode(&mut p);
        assert_eq!(ControllerInfo::parse(&p), c);
        let n = NamespaceInfo {
            nsid: 1,
            blocks: 1 << 20,
            block_size: 512,
        };
        n.encode(&mut p);
        assert_eq!(NamespaceInfo::parse(1, &p), n);
    }
}
