//! The partition hash. Fixed and documented: clients and every node must compute the same owner
//! for a key, across versions.
//!
//! `partition = fmix64(fnv1a64(encoded partition key)) mod partition_count`, where the encoded
//! partition key is [`crate::codec::encode_key`] applied to the partition-key columns in
//! partition-key order, FNV-1a is the 64-bit variant (offset 0xcbf29ce484222325, prime
//! 0x100000001b3) and fmix64 is MurmurHash3's 64-bit finalizer, which spreads FNV's weak low bits.

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

pub fn fnv1a64(bytes: &[u8]) -> u64 {
    fnv1a64_of(bytes.iter().copied())
}

/// [`fnv1a64`] of the ASCII-lowercased bytes, without a lowercased copy: table names compare
/// case-insensitively (`ClusterState::table`). Not a partition hash.
pub fn fnv1a64_caseless(s: &str) -> u64 {
    fnv1a64_of(s.bytes().map(|b| b.to_ascii_lowercase()))
}

fn fnv1a64_of(bytes: impl Iterator<Item = u8>) -> u64 {
    bytes.fold(FNV_OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(FNV_PRIME))
}

pub fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

/// Partition of an encoded partition key.
pub fn partition_of(encoded_partition_key: &[u8], partition_count: u32) -> u32 {
    debug_assert!(partition_count > 0);
    (fmix64(fnv1a64(encoded_partition_key)) % u64::from(partition_count.max(1))) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_stable() {
        // These numbers are part of the protocol: changing them moves every row.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(partition_of(b"", 8), (fmix64(0xcbf2_9ce4_8422_2325) % 8) as u32);
        assert_eq!(fnv1a64_caseless("Db.T1"), fnv1a64(b"db.t1"));
    }

    #[test]
    fn spreads_sequential_keys() {
        let mut counts = [0u32; 8];
        for i in 0u64..8000 {
            counts[partition_of(&i.to_be_bytes(), 8) as usize] += 1;
        }
        for c in counts {
            assert!((800..1200).contains(&c), "uneven spread {counts:?}");
        }
    }
}
