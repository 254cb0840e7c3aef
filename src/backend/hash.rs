//! twemproxy's twelve key hashes, bit for bit as nutcracker 0.5 computes them on x86-64;
//! placement (continuum, hash tags, dispatch) lives in `placement`.
//!
//! Several of twemproxy's hashes read the key through a plain `char *`, which is signed on
//! x86-64: a byte >= 0x80 enters the hash sign-extended. That quirk decides where non-ASCII
//! keys live in an existing pool, so `signed` reproduces it wherever the C code does it.

use md5::{Digest, Md5};
use std::fmt;
use std::str::FromStr;

use super::UnknownName;

/// A key hash, named as twemproxy's `hash:` setting names it.
#[allow(non_camel_case_types)] // the names mirror twemproxy's `fnv1a_64` and friends
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashFn {
    OneAtATime,
    Md5,
    Crc16,
    Crc32,
    Crc32a,
    Fnv1_64,
    Fnv1a_64,
    Fnv1_32,
    Fnv1a_32,
    Hsieh,
    Murmur,
    Jenkins,
}

const NAMES: [(HashFn, &str); 12] = [
    (HashFn::OneAtATime, "one_at_a_time"),
    (HashFn::Md5, "md5"),
    (HashFn::Crc16, "crc16"),
    (HashFn::Crc32, "crc32"),
    (HashFn::Crc32a, "crc32a"),
    (HashFn::Fnv1_64, "fnv1_64"),
    (HashFn::Fnv1a_64, "fnv1a_64"),
    (HashFn::Fnv1_32, "fnv1_32"),
    (HashFn::Fnv1a_32, "fnv1a_32"),
    (HashFn::Hsieh, "hsieh"),
    (HashFn::Murmur, "murmur"),
    (HashFn::Jenkins, "jenkins"),
];

impl HashFn {
    pub const ALL: [HashFn; 12] = {
        let mut all = [HashFn::Md5; 12];
        let mut i = 0;
        while i < 12 {
            all[i] = NAMES[i].0;
            i += 1;
        }
        all
    };

    /// The name twemproxy's configuration uses for this hash.
    pub fn name(self) -> &'static str {
        NAMES
            .iter()
            .find(|(f, _)| *f == self)
            .map_or("", |(_, n)| n)
    }
}

impl fmt::Display for HashFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for HashFn {
    type Err = UnknownName;

    /// Exact, case-sensitive names, as twemproxy's `conf_set_hash` compares them.
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        NAMES
            .iter()
            .find(|(_, n)| *n == s)
            .map(|(f, _)| *f)
            .ok_or_else(|| {
                let known: Vec<&str> = NAMES.iter().map(|(_, n)| *n).collect();
                UnknownName {
                    setting: "hash",
                    value: s.to_string(),
                    known: known.join(", "),
                }
            })
    }
}

/// Hashes `key` as twemproxy's `hash_<name>` does. Placement adds the rules around it
/// (an empty key or a one-node pool maps to hash 0 without calling this).
pub fn hash(f: HashFn, key: &[u8]) -> u32 {
    match f {
        HashFn::OneAtATime => one_at_a_time(key),
        HashFn::Md5 => md5_word(key, 0),
        HashFn::Crc16 => crc16(key),
        HashFn::Crc32 => (!crc32_raw(key) >> 16) & 0x7fff,
        HashFn::Crc32a => !crc32_raw(key),
        HashFn::Fnv1_64 => fnv1_64(key),
        HashFn::Fnv1a_64 => fnv1a_64(key),
        HashFn::Fnv1_32 => fnv1_32(key),
        HashFn::Fnv1a_32 => fnv1a_32(key),
        HashFn::Hsieh => hsieh(key),
        HashFn::Murmur => murmur(key),
        HashFn::Jenkins => jenkins(key),
    }
}

/// A byte as C's signed `char` widens it to 32 bits.
#[inline]
fn signed(b: u8) -> u32 {
    b as i8 as i32 as u32
}

/// The little-endian word `word` (0..4) of the md5 digest: `hash_md5` takes word 0 and the
/// ketama continuum takes all four.
pub(crate) fn md5_word(data: &[u8], word: usize) -> u32 {
    let d = Md5::digest(data);
    let i = (word & 3) * 4;
    u32::from_le_bytes([d[i], d[i + 1], d[i + 2], d[i + 3]])
}

/// All four digest words at once, for building the ketama continuum.
pub(crate) fn md5_words(data: &[u8]) -> [u32; 4] {
    let d = Md5::digest(data);
    std::array::from_fn(|w| {
        u32::from_le_bytes([d[w * 4], d[w * 4 + 1], d[w * 4 + 2], d[w * 4 + 3]])
    })
}

fn one_at_a_time(key: &[u8]) -> u32 {
    let mut v: u32 = 0;
    for &b in key {
        v = v.wrapping_add(signed(b));
        v = v.wrapping_add(v << 10);
        v ^= v >> 6;
    }
    v = v.wrapping_add(v << 3);
    v ^= v >> 11;
    v.wrapping_add(v << 15)
}

/// CCITT (XMODEM) table, the one Redis Cluster hashes slots with (`slots::crc16` shares
/// it). twemproxy never masks the register to 16 bits, so its result keeps the bits
/// shifted past bit 15 and ours must too; each entry itself fits in 16 bits.
pub(in crate::backend) const CRC16_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = (i as u32) << 8;
        let mut k = 0;
        while k < 8 {
            c = if c & 0x8000 != 0 {
                (c << 1) ^ 0x1021
            } else {
                c << 1
            };
            k += 1;
        }
        t[i] = c & 0xffff;
        i += 1;
    }
    t
};

fn crc16(key: &[u8]) -> u32 {
    let mut crc: u32 = 0;
    for &b in key {
        crc = (crc << 8) ^ CRC16_TABLE[(((crc >> 8) ^ signed(b)) & 0xff) as usize];
    }
    crc
}

const CRC32_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// The CRC-32 register before the final inversion; `crc32` (libmemcached's variant) and
/// `crc32a` (the standard one) finish it differently.
fn crc32_raw(key: &[u8]) -> u32 {
    key.iter().fold(u32::MAX, |crc, &b| {
        (crc >> 8) ^ CRC32_TABLE[((crc ^ b as u32) & 0xff) as usize]
    })
}

const FNV_64_INIT: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_64_PRIME: u64 = 0x0000_0100_0000_01b3;
const FNV_32_INIT: u32 = 2_166_136_261;
const FNV_32_PRIME: u32 = 16_777_619;

fn fnv1_64(key: &[u8]) -> u32 {
    let mut h = FNV_64_INIT;
    for &b in key {
        h = h.wrapping_mul(FNV_64_PRIME);
        h ^= b as i8 as i64 as u64;
    }
    h as u32
}

/// twemproxy's "fnv1a_64" runs in 32 bits with the 64-bit constants truncated; it is not
/// the FNV-1a 64 of the spec, and placement compatibility needs exactly this.
fn fnv1a_64(key: &[u8]) -> u32 {
    let mut h = FNV_64_INIT as u32;
    for &b in key {
        h ^= signed(b);
        h = h.wrapping_mul(FNV_64_PRIME as u32);
    }
    h
}

fn fnv1_32(key: &[u8]) -> u32 {
    let mut h = FNV_32_INIT;
    for &b in key {
        h = h.wrapping_mul(FNV_32_PRIME);
        h ^= signed(b);
    }
    h
}

fn fnv1a_32(key: &[u8]) -> u32 {
    let mut h = FNV_32_INIT;
    for &b in key {
        h ^= signed(b);
        h = h.wrapping_mul(FNV_32_PRIME);
    }
    h
}

fn hsieh(key: &[u8]) -> u32 {
    if key.is_empty() {
        return 0;
    }
    let get16 = |s: &[u8]| u32::from(s[0]) | (u32::from(s[1]) << 8);
    let mut h: u32 = 0;
    let mut chunks = key.chunks_exact(4);
    for c in &mut chunks {
        h = h.wrapping_add(get16(c));
        let tmp = (get16(&c[2..]) << 11) ^ h;
        h = (h << 16) ^ tmp;
        h = h.wrapping_add(h >> 11);
    }
    let rest = chunks.remainder();
    match rest.len() {
        3 => {
            h = h.wrapping_add(get16(rest));
            h ^= h << 16;
            h ^= signed(rest[2]) << 18;
            h = h.wrapping_add(h >> 11);
        }
        2 => {
            h = h.wrapping_add(get16(rest));
            h ^= h << 11;
            h = h.wrapping_add(h >> 17);
        }
        1 => {
            h = h.wrapping_add(u32::from(rest[0]));
            h ^= h << 10;
            h = h.wrapping_add(h >> 1);
        }
        _ => {}
    }
    h ^= h << 3;
    h = h.wrapping_add(h >> 5);
    h ^= h << 4;
    h = h.wrapping_add(h >> 17);
    h ^= h << 25;
    h.wrapping_add(h >> 6)
}

/// MurmurHash2 with twemproxy's length-derived seed.
fn murmur(key: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    let len = key.len() as u32;
    let mut h = 0xdead_beef_u32.wrapping_mul(len) ^ len;
    let mut chunks = key.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^ (h >> 15)
}

/// Bob Jenkins' lookup3 `hashlittle` with initval 13; the C code's three read paths
/// (aligned words, halves, bytes) agree on little-endian, so bytes suffice.
fn jenkins(key: &[u8]) -> u32 {
    let init = 0xdead_beef_u32
        .wrapping_add(key.len() as u32)
        .wrapping_add(13);
    let (mut a, mut b, mut c) = (init, init, init);
    if key.is_empty() {
        return c;
    }
    let word = |s: &[u8]| {
        let mut w = [0u8; 4];
        w[..s.len().min(4)].copy_from_slice(&s[..s.len().min(4)]);
        u32::from_le_bytes(w)
    };
    let mut k = key;
    while k.len() > 12 {
        a = a.wrapping_add(word(&k[0..4]));
        b = b.wrapping_add(word(&k[4..8]));
        c = c.wrapping_add(word(&k[8..12]));
        // mix(a, b, c)
        a = a.wrapping_sub(c);
        a ^= c.rotate_left(4);
        c = c.wrapping_add(b);
        b = b.wrapping_sub(a);
        b ^= a.rotate_left(6);
        a = a.wrapping_add(c);
        c = c.wrapping_sub(b);
        c ^= b.rotate_left(8);
        b = b.wrapping_add(a);
        a = a.wrapping_sub(c);
        a ^= c.rotate_left(16);
        c = c.wrapping_add(b);
        b = b.wrapping_sub(a);
        b ^= a.rotate_left(19);
        a = a.wrapping_add(c);
        c = c.wrapping_sub(b);
        c ^= b.rotate_left(4);
        b = b.wrapping_add(a);
        k = &k[12..];
    }
    // The last 1..=12 bytes, zero-padded, as the C code's masked tail reads them.
    a = a.wrapping_add(word(k));
    if k.len() > 4 {
        b = b.wrapping_add(word(&k[4..]));
    }
    if k.len() > 8 {
        c = c.wrapping_add(word(&k[8..]));
    }
    // final(a, b, c)
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(14));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(11));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(25));
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(16));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(4));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(14));
    c ^= b;
    c.wrapping_sub(b.rotate_left(24))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference values from twemproxy's hashkit C code compiled with gcc on x86-64 (md5 and
    /// the crc32 pair also agree with Python's hashlib and zlib). Columns follow `HashFn::ALL`.
    #[rustfmt::skip]
    const VECTORS: &[(&[u8], [u32; 12])] = &[
        (b"", [0, 3649838548, 0, 0, 0, 2216829733, 2216829733, 2166136261, 2166136261, 0, 0, 3735928572]),
        (b"a", [3392050242, 3111502092, 31879, 26807, 3904355907, 2248259518, 2248273036, 84696446, 3826002220, 2472816263, 1262581116, 3768813200]),
        (b"ab", [1172708952, 1140096536, 8156415, 7811, 2659403885, 3035314104, 3041237098, 1886858552, 1294271946, 1535905475, 3820310011, 3249891675]),
        (b"abc", [3977453403, 2555380112, 2088017366, 13604, 891568578, 1806675403, 88168267, 1134309195, 440920331, 3843582778, 2064434216, 2403423744]),
        (b"abcd", [3448463878, 1282538722, 1956489270, 28034, 3984772369, 4219752341, 3993445597, 3118363509, 3459545533, 984896216, 4016735919, 3574732058]),
        (b"abcde", [3112524284, 3652474539, 2645049057, 1415, 2240272485, 1641232970, 1982031016, 238010698, 1956368136, 2222483234, 2586197722, 1560228699]),
        (b"abcdef", [23155311, 391121896, 2822650621, 19342, 1267612143, 971770840, 3190049290, 2670544664, 4282878506, 3195826148, 3770342550, 189448926]),
        (b"abcdefg", [1254556024, 258786938, 1044018776, 12586, 824863398, 1813520495, 397047607, 2890328751, 715044663, 1034764719, 3953608434, 1985022340]),
        (b"abcdefgh", [1154667489, 2168511720, 980855807, 12015, 2934909520, 2902400245, 917034605, 3802362133, 1994041997, 4286381702, 4267571655, 3764364299]),
        (b"abcdefghi", [3367291517, 530295178, 1990919694, 3497, 2376698031, 4118688806, 3773016268, 3695903846, 4265280748, 2805871937, 3389747401, 1630893906]),
        (b"abcdefghij", [1882269853, 1767318953, 2869338922, 14721, 964784186, 628268280, 584552978, 806874360, 3169328882, 763103107, 254219480, 298084569]),
        (b"abcdefghijk", [933370042, 3435968914, 111374916, 20055, 3461812127, 2713762051, 877519771, 2913602051, 4201130715, 1738093872, 3121056604, 398501375]),
        (b"abcdefghijkl", [1616577344, 114739615, 2742204415, 30328, 4135066404, 3665453173, 3764018357, 1705886421, 3908779541, 1600274825, 3087340362, 4220209635]),
        (b"abcdefghijklm", [1838806748, 3518869026, 1924633911, 24052, 3723783842, 1039263394, 965460744, 3851007266, 998463208, 1892570132, 696768699, 3055675487]),
        (b"hello world", [1045060183, 3141252702, 4060494820, 3402, 222957957, 2979073647, 37540583, 1418570095, 3582672807, 1333368947, 1578702139, 355681275]),
        (b"user:1000", [3043211087, 781738503, 3781445233, 8052, 2675185635, 3550362913, 2927313545, 2796551329, 1350311305, 3723237737, 2384768711, 76303748]),
        (b"\x80", [3273477671, 2128427405, 37256, 16314, 1069182125, 2046707807, 2046684255, 4210270879, 83079839, 3606367026, 2421514821, 2976898632]),
        (b"\xff\xfe", [3677141090, 22524659, 1969454, 2296, 2297966742, 3035328926, 3035516848, 309762398, 897126160, 3425753411, 110360745, 121975773]),
        (b"ab\xff", [100913432, 2192293236, 2088034275, 19613, 3432881837, 2488291927, 4206756399, 3160658135, 3283607919, 1977393110, 3968893618, 3920586603]),
        (b"caf\xc3\xa9", [3650908318, 3833532679, 4129724007, 6317, 2561491637, 2315714289, 3472276361, 3598905713, 1970454601, 3728705621, 3658586143, 3412207021]),
        (b"key\x80\x81\x82\xff", [1594823638, 968054492, 3434472334, 4415, 2436827646, 828094382, 2267523272, 1170830926, 3259837256, 1058907136, 12276133, 840811043]),
        (b"The quick brown fox jumps over the lazy dog", [1369346549, 2642219166, 581169352, 16719, 1095738169, 2112060110, 3890508048, 3922226286, 76545936, 471461527, 818385189, 314054204]),
    ];

    #[test]
    fn every_hash_matches_twemproxy_reference_values() {
        for (key, expected) in VECTORS {
            for (f, want) in HashFn::ALL.iter().zip(expected) {
                assert_eq!(hash(*f, key), *want, "{f} of {key:?}");
            }
        }
    }

    #[test]
    fn high_bytes_enter_as_signed_chars() {
        // Unsigned reading would give a different fnv1a_64 for a key of one 0x80 byte.
        let unsigned = (0x8422_2325u32 ^ 0x80).wrapping_mul(0x1b3);
        assert_ne!(hash(HashFn::Fnv1a_64, b"\x80"), unsigned);
        let signed = (0x8422_2325u32 ^ 0xffff_ff80).wrapping_mul(0x1b3);
        assert_eq!(hash(HashFn::Fnv1a_64, b"\x80"), signed);
    }

    #[test]
    fn config_names_round_trip() {
        for f in HashFn::ALL {
            assert_eq!(f.name().parse::<HashFn>(), Ok(f));
        }
        assert_eq!("fnv1a_64".parse(), Ok(HashFn::Fnv1a_64));
        assert!("FNV1A_64".parse::<HashFn>().is_err());
        assert!("crc64".parse::<HashFn>().is_err());
    }

    #[test]
    fn md5_words_are_the_digest_in_little_endian_quarters() {
        // md5("a") = 0cc175b9 c0f1b6a8 31c399e2 69772661
        assert_eq!(
            md5_words(b"a"),
            [0xb975_c10c, 0xa8b6_f1c0, 0xe299_c331, 0x6126_7769]
        );
        assert_eq!(md5_word(b"a", 0), hash(HashFn::Md5, b"a"));
    }
}
