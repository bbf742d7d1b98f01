//! The runtime's integrity check (the INTEGRITY_CHECK export table, docs/cuda-api.md):
//! libcudart hands the driver a version number and a time, the driver answers a 128-bit
//! digest of those, the process, the calling thread, the addresses of its own tables and
//! every device's identity, and libcudart computes the same digest to check it talks to
//! the driver it expects. The digest is HMAC-MD2 under a fixed key. Everything it covers
//! is local to the program's process (nothing goes to the worker).

/// MD2's substitution table (RFC 1319), built from the digits of pi.
const S: [u8; 256] = [
    0x29, 0x2E, 0x43, 0xC9, 0xA2, 0xD8, 0x7C, 0x01, 0x3D, 0x36, 0x54, 0xA1, 0xEC, 0xF0, 0x06, 0x13,
    0x62, 0xA7, 0x05, 0xF3, 0xC0, 0xC7, 0x73, 0x8C, 0x98, 0x93, 0x2B, 0xD9, 0xBC, 0x4C, 0x82, 0xCA,
    0x1E, 0x9B, 0x57, 0x3C, 0xFD, 0xD4, 0xE0, 0x16, 0x67, 0x42, 0x6F, 0x18, 0x8A, 0x17, 0xE5, 0x12,
    0xBE, 0x4E, 0xC4, 0xD6, 0xDA, 0x9E, 0xDE, 0x49, 0xA0, 0xFB, 0xF5, 0x8E, 0xBB, 0x2F, 0xEE, 0x7A,
    0xA9, 0x68, 0x79, 0x91, 0x15, 0xB2, 0x07, 0x3F, 0x94, 0xC2, 0x10, 0x89, 0x0B, 0x22, 0x5F, 0x21,
    0x80, 0x7F, 0x5D, 0x9A, 0x5A, 0x90, 0x32, 0x27, 0x35, 0x3E, 0xCC, 0xE7, 0xBF, 0xF7, 0x97, 0x03,
    0xFF, 0x19, 0x30, 0xB3, 0x48, 0xA5, 0xB5, 0xD1, 0xD7, 0x5E, 0x92, 0x2A, 0xAC, 0x56, 0xAA, 0xC6,
    0x4F, 0xB8, 0x38, 0xD2, 0x96, 0xA4, 0x7D, 0xB6, 0x76, 0xFC, 0x6B, 0xE2, 0x9C, 0x74, 0x04, 0xF1,
    0x45, 0x9D, 0x70, 0x59, 0x64, 0x71, 0x87, 0x20, 0x86, 0x5B, 0xCF, 0x65, 0xE6, 0x2D, 0xA8, 0x02,
    0x1B, 0x60, 0x25, 0xAD, 0xAE, 0xB0, 0xB9, 0xF6, 0x1C, 0x46, 0x61, 0x69, 0x34, 0x40, 0x7E, 0x0F,
    0x55, 0x47, 0xA3, 0x23, 0xDD, 0x51, 0xAF, 0x3A, 0xC3, 0x5C, 0xF9, 0xCE, 0xBA, 0xC5, 0xEA, 0x26,
    0x2C, 0x53, 0x0D, 0x6E, 0x85, 0x28, 0x84, 0x09, 0xD3, 0xDF, 0xCD, 0xF4, 0x41, 0x81, 0x4D, 0x52,
    0x6A, 0xDC, 0x37, 0xC8, 0x6C, 0xC1, 0xAB, 0xFA, 0x24, 0xE1, 0x7B, 0x08, 0x0C, 0xBD, 0xB1, 0x4A,
    0x78, 0x88, 0x95, 0x8B, 0xE3, 0x63, 0xE8, 0x6D, 0xE9, 0xCB, 0xD5, 0xFE, 0x3B, 0x00, 0x1D, 0x39,
    0xF2, 0xEF, 0xB7, 0x0E, 0x66, 0x58, 0xD0, 0xE4, 0xA6, 0x77, 0x72, 0xF8, 0xEB, 0x75, 0x4B, 0x0A,
    0x31, 0x44, 0x50, 0xB4, 0x8F, 0xED, 0x1F, 0x1A, 0xDB, 0x99, 0x8D, 0x33, 0x9F, 0x11, 0x83, 0x14,
];

/// The HMAC key.
const KEY: [u8; 16] = [
    0x14, 0x6A, 0xDD, 0xAE, 0x53, 0xA9, 0xA7, 0x52, 0xAA, 0x08, 0x41, 0x36, 0x0B, 0xF5, 0x5A, 0x9F,
];

/// An MD2 hash in progress.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Md2 {
    /// The state (16 bytes), the block being filled (16) and their xor (16).
    x: [u8; 48],
    checksum: [u8; 16],
    /// Bytes in the current block.
    n: usize,
    /// The last checksum byte.
    l: u8,
}

impl Md2 {
    fn new() -> Self {
        Md2 {
            x: [0; 48],
            checksum: [0; 16],
            n: 0,
            l: 0,
        }
    }

    fn byte(&mut self, b: u8) {
        let n = self.n;
        self.x[16 + n] = b;
        self.x[32 + n] = self.x[n] ^ b;
        self.checksum[n] ^= S[usize::from(b ^ self.l)];
        self.l = self.checksum[n];
        self.n = (n + 1) & 15;
        if self.n == 0 {
            let mut t = 0u8;
            for round in 0..18u8 {
                for v in self.x.iter_mut() {
                    *v ^= S[usize::from(t)];
                    t = *v;
                }
                t = t.wrapping_add(round);
            }
        }
    }

    fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.byte(b);
        }
    }

    fn finish(mut self) -> [u8; 16] {
        let pad = (16 - self.n) as u8;
        for _ in 0..pad {
            self.byte(pad);
        }
        // Byte i of the checksum is read before it is updated again (the block starts
        // at 0, and feeding byte i only changes checksum[i]).
        for i in 0..16 {
            let c = self.checksum[i];
            self.byte(c);
        }
        let mut out = [0; 16];
        out.copy_from_slice(&self.x[..16]);
        out
    }
}

/// HMAC-MD2 of `message` under [`KEY`].
fn hmac(message: &[u8]) -> [u8; 16] {
    let mut inner = Md2::new();
    inner.update(&KEY.map(|k| k ^ 0x36));
    inner.update(message);
    let inner = inner.finish();
    let mut outer = Md2::new();
    outer.update(&KEY.map(|k| k ^ 0x5c));
    outer.update(&inner);
    outer.finish()
}

/// One device as the check sees it.
#[derive(Clone, Copy, Debug)]
pub struct DeviceIdentity {
    pub uuid: [u8; 16],
    pub pci_domain: i32,
    pub pci_bus: i32,
    pub pci_device: i32,
}

/// What the digest covers besides the devices: the runtime's `version` and `unix_seconds`,
/// the driver version the library reports, the process id, the low 32 bits of the calling
/// thread's `pthread_self()`, and the addresses of the CUDART_INTERFACE table, the
/// INTEGRITY_CHECK table and the check function itself.
#[derive(Clone, Copy, Debug)]
pub struct Inputs {
    pub version: u32,
    pub unix_seconds: u64,
    pub driver_version: u32,
    pub process: u32,
    pub thread: u32,
    pub cudart_table: usize,
    pub integrity_table: usize,
    pub function: usize,
}

/// The digest the driver answers, as two native-endian 64-bit words.
pub fn digest(i: &Inputs, devices: &[DeviceIdentity]) -> [u64; 2] {
    // Runtimes whose version ends in 0 or 1 expect a fixed answer.
    match i.version % 10 {
        0 => return [0x3341_181C_03CB_675C, 0x8ED3_83AA_1F4C_D1E8],
        1 => return [0x1841_181C_03CB_675C, 0x8ED3_83AA_1F4C_D1E8],
        _ => {}
    }
    // The C struct the driver hashes: four u32, three pointers, a u64 (no padding).
    let mut msg = Vec::with_capacity(48 + 28 * devices.len());
    for w in [i.driver_version, i.version, i.process, i.thread] {
        msg.extend_from_slice(&w.to_ne_bytes());
    }
    for p in [i.cudart_table, i.integrity_table, i.function] {
        msg.extend_from_slice(&(p as u64).to_ne_bytes());
    }
    msg.extend_from_slice(&i.unix_seconds.to_ne_bytes());
    for d in devices {
        msg.extend_from_slice(&d.uuid);
        for v in [d.pci_domain, d.pci_bus, d.pci_device] {
            msg.extend_from_slice(&v.to_ne_bytes());
        }
    }
    let h = hmac(&msg);
    let word = |r: std::ops::Range<usize>| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&h[r]);
        u64::from_ne_bytes(b)
    };
    [word(0..8), word(8..16)]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state as the driver lays it out: x, checksum, count, last checksum byte.
    fn layout(m: &Md2) -> Vec<u8> {
        let mut v = m.x.to_vec();
        v.extend_from_slice(&m.checksum);
        v.push(m.n as u8);
        v.push(m.l);
        v
    }

    fn from_layout(b: &[u8; 66]) -> Md2 {
        let mut m = Md2::new();
        m.x.copy_from_slice(&b[..48]);
        m.checksum.copy_from_slice(&b[48..64]);
        m.n = usize::from(b[64]);
        m.l = b[65];
        m
    }

    // States of NVIDIA's driver during one check (a CUDA 12.8 runtime), as ZLUDA recorded
    // them for its reimplementation.

    #[test]
    fn the_inner_key_block_gives_the_drivers_state() {
        let mut m = Md2::new();
        m.update(&KEY.map(|k| k ^ 0x36));
        let expected = [
            0x8b, 0x21, 0x9a, 0x49, 0xe8, 0x6d, 0x1a, 0xee, 0xf2, 0x37, 0xf9, 0xb5, 0x4a, 0x8c,
            0x3c, 0x75, 0xc7, 0x1e, 0xee, 0x21, 0xcf, 0x29, 0x8a, 0xe5, 0x13, 0x83, 0xf4, 0xec,
            0x33, 0x04, 0xe2, 0xfd, 0xb0, 0x2f, 0x09, 0x01, 0x4f, 0xf7, 0x68, 0x6d, 0x69, 0x46,
            0x43, 0x7e, 0xb6, 0x2b, 0x21, 0xed, 0x57, 0xa1, 0x10, 0x86, 0x0e, 0x60, 0x44, 0x1e,
            0x70, 0x5f, 0x67, 0xd1, 0xeb, 0x67, 0xa1, 0x3d, 0x00, 0x3d,
        ];
        assert_eq!(layout(&m), expected.to_vec());
    }

    #[test]
    fn the_process_block_gives_the_drivers_state() {
        let start = [
            0x8b, 0x21, 0x9a, 0x49, 0xe8, 0x6d, 0x1a, 0xee, 0xf2, 0x37, 0xf9, 0xb5, 0x4a, 0x8c,
            0x3c, 0x75, 0xc7, 0x1e, 0xee, 0x21, 0xcf, 0x29, 0x8a, 0xe5, 0x13, 0x83, 0xf4, 0xec,
            0x33, 0x04, 0xe2, 0xfd, 0xb0, 0x2f, 0x09, 0x01, 0x4f, 0xf7, 0x68, 0x6d, 0x69, 0x46,
            0x43, 0x7e, 0xb6, 0x2b, 0x21, 0xed, 0x57, 0xa1, 0x10, 0x86, 0x0e, 0x60, 0x44, 0x1e,
            0x70, 0x5f, 0x67, 0xd1, 0xeb, 0x67, 0xa1, 0x3d, 0x00, 0x3d,
        ];
        let mut m = from_layout(&start);
        let mut msg = Vec::new();
        for w in [0x2f30u32, 12082, 0x002f_a423, 0xf79c_1000] {
            msg.extend_from_slice(&w.to_le_bytes());
        }
        for p in [
            0x7fff_f695_8240u64,
            0x7fff_f695_8220,
            0x7fff_f2aa_f4a0,
            0x682b_9cee,
        ] {
            msg.extend_from_slice(&p.to_le_bytes());
        }
        m.update(&msg);
        let expected = [
            0x0a, 0xfd, 0xab, 0xc9, 0xff, 0x9b, 0xa0, 0xbe, 0x4d, 0x30, 0x32, 0x82, 0x74, 0x4f,
            0xa7, 0x48, 0x9d, 0x23, 0x82, 0xa3, 0x87, 0xfa, 0x6c, 0xdb, 0x92, 0x49, 0xd9, 0xb5,
            0x4b, 0x2b, 0x5e, 0x51, 0x6e, 0xf7, 0xf9, 0x4d, 0x28, 0x8a, 0x64, 0x06, 0x19, 0xb3,
            0xe6, 0xbe, 0xa4, 0xec, 0x7e, 0x54, 0x64, 0x28, 0xd9, 0xe1, 0xd4, 0x34, 0xc0, 0xa9,
            0x49, 0x88, 0xc9, 0x61, 0x58, 0xdd, 0x66, 0x74, 0x00, 0x74,
        ];
        assert_eq!(layout(&m), expected.to_vec());
    }

    #[test]
    fn finishing_gives_the_drivers_digest() {
        let start = [
            0x3e, 0x4b, 0xf2, 0x95, 0x71, 0xf5, 0x6b, 0x51, 0x07, 0xbf, 0x4b, 0xf1, 0x04, 0x0e,
            0x8e, 0x0b, 0x5f, 0x4d, 0x30, 0x0c, 0x0f, 0x0c, 0xae, 0xfb, 0x48, 0xaf, 0x23, 0xb5,
            0xea, 0x4c, 0xc2, 0xdb, 0xd7, 0xdf, 0x88, 0x74, 0x39, 0x58, 0x16, 0x3a, 0x1f, 0x7c,
            0x9b, 0x20, 0x7e, 0x7e, 0x94, 0xc8, 0x8b, 0xc6, 0xb2, 0x38, 0x0d, 0x07, 0x7d, 0xbd,
            0x90, 0xd5, 0x39, 0x63, 0xeb, 0x1d, 0x4f, 0x40, 0x00, 0x40,
        ];
        let out = from_layout(&start).finish();
        assert_eq!(
            out,
            [
                0x00, 0x23, 0x53, 0x06, 0x5e, 0x96, 0xf6, 0x9c, 0x61, 0xaa, 0x96, 0x2d, 0x2e, 0xcd,
                0xa8, 0x58
            ]
        );
    }

    #[test]
    fn md2_matches_rfc_1319() {
        let hex = |m: &[u8]| {
            let mut h = Md2::new();
            h.update(m);
            h.finish()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        };
        assert_eq!(hex(b""), "8350e5a3e24c153df2275c9f80692773");
        assert_eq!(hex(b"abc"), "da853b0d3f88d99b30283a69e6ded6bb");
        assert_eq!(
            hex(b"abcdefghijklmnopqrstuvwxyz"),
            "4e8ddff3650292ab5a4108c3aa47940b"
        );
    }

    #[test]
    fn the_digest_depends_on_every_input_and_fixed_versions_are_constant() {
        let base = Inputs {
            version: 12082,
            unix_seconds: 0x682b_9cee,
            driver_version: 13000,
            process: 42,
            thread: 7,
            cudart_table: 0x1000,
            integrity_table: 0x2000,
            function: 0x3000,
        };
        let dev = DeviceIdentity {
            uuid: [1; 16],
            pci_domain: 0,
            pci_bus: 2,
            pci_device: 0,
        };
        let d = digest(&base, &[dev]);
        assert_eq!(d, digest(&base, &[dev]));
        assert_ne!(d, digest(&Inputs { thread: 8, ..base }, &[dev]));
        assert_ne!(
            d,
            digest(
                &Inputs {
                    function: 0x3008,
                    ..base
                },
                &[dev]
            )
        );
        assert_ne!(d, digest(&base, &[DeviceIdentity { pci_bus: 3, ..dev }]));
        assert_ne!(d, digest(&base, &[]));
        let fixed = Inputs {
            version: 12080,
            ..base
        };
        assert_eq!(digest(&fixed, &[dev])[0], 0x3341_181C_03CB_675C);
        assert_eq!(
            digest(&fixed, &[]),
            digest(&Inputs { thread: 1, ..fixed }, &[])
        );
    }
}
