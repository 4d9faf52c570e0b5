//! Just enough of a BTF reader to find type ids in `/sys/kernel/btf/vmlinux`.
//!
//! BPF LSM, fentry and `tp_btf` programs must name their hook by BTF type id at load time. The
//! format (Documentation/bpf/btf.rst): a header, a type section of variable-length records, and
//! a string section. Type ids start at 1 in the order the records appear.

use std::collections::HashMap;

const BTF_MAGIC: u16 = 0xeb9f;

/// BTF kinds we look up (`BTF_KIND_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Struct = 4,
    Typedef = 8,
    Func = 12,
}

/// Why a BTF blob could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BtfError {
    #[error("btf: truncated at byte {0}")]
    Truncated(usize),
    #[error("btf: bad magic {0:#06x}")]
    BadMagic(u16),
    #[error("btf: unknown kind {kind} at type id {id}")]
    UnknownKind { kind: u32, id: u32 },
}

fn u32_at(data: &[u8], off: usize) -> Result<u32, BtfError> {
    data.get(off..off + 4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or(BtfError::Truncated(off))
}

fn str_at(strings: &[u8], off: usize) -> Option<&[u8]> {
    let rest = strings.get(off..)?;
    let end = rest.iter().position(|&b| b == 0)?;
    Some(&rest[..end])
}

/// Finds the type id of each `(kind, name)` in `wanted`, in one pass over `data` (a raw BTF
/// blob in the host's byte order, little-endian on the machines we support).
pub fn find_type_ids(data: &[u8], wanted: &[(Kind, &str)]) -> Result<Vec<Option<u32>>, BtfError> {
    let magic = data
        .get(0..2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .ok_or(BtfError::Truncated(0))?;
    if magic != BTF_MAGIC {
        return Err(BtfError::BadMagic(magic));
    }
    let hdr_len = u32_at(data, 4)? as usize;
    let type_off = u32_at(data, 8)? as usize;
    let type_len = u32_at(data, 12)? as usize;
    let str_off = u32_at(data, 16)? as usize;
    let str_len = u32_at(data, 20)? as usize;
    let types_start = hdr_len + type_off;
    let types = data
        .get(types_start..types_start + type_len)
        .ok_or(BtfError::Truncated(types_start + type_len))?;
    let strings = data
        .get(hdr_len + str_off..hdr_len + str_off + str_len)
        .ok_or(BtfError::Truncated(hdr_len + str_off + str_len))?;

    let mut index: HashMap<(u32, &[u8]), usize> = HashMap::new();
    for (i, (kind, name)) in wanted.iter().enumerate() {
        index.insert((*kind as u32, name.as_bytes()), i);
    }
    let mut found = vec![None; wanted.len()];
    let mut remaining = wanted.len();

    let mut off = 0usize;
    let mut id = 1u32;
    while off < types.len() && remaining > 0 {
        let name_off = u32_at(types, off)? as usize;
        let info = u32_at(types, off + 4)?;
        let vlen = (info & 0xffff) as usize;
        let kind = (info >> 24) & 0x1f;
        let extra = match kind {
            1 => 4,                       // INT
            2 | 7 | 8 | 9 | 10 | 11 => 0, // PTR FWD TYPEDEF VOLATILE CONST RESTRICT
            3 => 12,                      // ARRAY
            4 | 5 => 12 * vlen,           // STRUCT UNION
            6 => 8 * vlen,                // ENUM
            12 => 0,                      // FUNC
            13 => 8 * vlen,               // FUNC_PROTO
            14 => 4,                      // VAR
            15 => 12 * vlen,              // DATASEC
            16 | 18 => 0,                 // FLOAT TYPE_TAG
            17 => 4,                      // DECL_TAG
            19 => 12 * vlen,              // ENUM64
            _ => return Err(BtfError::UnknownKind { kind, id }),
        };
        if let Some(name) = str_at(strings, name_off)
            && let Some(&slot) = index.get(&(kind, name))
            && found[slot].is_none()
        {
            found[slot] = Some(id);
            remaining -= 1;
        }
        off += 12 + extra;
        id += 1;
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-built blob: INT "int", FUNC_PROTO, FUNC "bpf_lsm_file_open", TYPEDEF "t".
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0bpf_lsm_file_open\0t\0".to_vec();
        let mut types = Vec::new();
        let mut rec = |name: u32, info: u32, size: u32, extra: &[u32]| {
            for v in [name, info, size].iter().chain(extra) {
                types.extend_from_slice(&v.to_le_bytes());
            }
        };
        rec(1, 1 << 24, 4, &[32]); // id 1 INT
        rec(0, (13 << 24) | 1, 1, &[0, 1]); // id 2 FUNC_PROTO with one param
        rec(5, 12 << 24, 2, &[]); // id 3 FUNC
        rec(23, 8 << 24, 1, &[]); // id 4 TYPEDEF
        let mut out = Vec::new();
        out.extend_from_slice(&BTF_MAGIC.to_le_bytes());
        out.push(1);
        out.push(0);
        for v in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&types);
        out.extend_from_slice(&strings);
        out
    }

    #[test]
    fn finds_func_and_typedef_by_kind_and_name() {
        let ids = find_type_ids(
            &blob(),
            &[
                (Kind::Func, "bpf_lsm_file_open"),
                (Kind::Typedef, "t"),
                (Kind::Func, "t"),
                (Kind::Struct, "missing"),
            ],
        )
        .expect("valid blob");
        assert_eq!(ids, vec![Some(3), Some(4), None, None]);
    }

    #[test]
    fn rejects_bad_magic_and_truncation() {
        assert_eq!(find_type_ids(b"\0\0", &[]), Err(BtfError::BadMagic(0)));
        let mut b = blob();
        b.truncate(30);
        assert!(matches!(
            find_type_ids(&b, &[]),
            Err(BtfError::Truncated(_))
        ));
    }

    #[test]
    fn finds_lsm_hook_in_running_kernel_btf() {
        let Ok(data) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            eprintln!("skipped: no /sys/kernel/btf/vmlinux on this kernel");
            return;
        };
        let ids = find_type_ids(&data, &[(Kind::Func, "bpf_lsm_file_open")]).expect("parses");
        assert!(
            ids[0].is_some(),
            "bpf_lsm_file_open not found in vmlinux BTF"
        );
    }
}
