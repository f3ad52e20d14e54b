//! POSIX ustar headers: writing, and reading back (for checks).

use std::io;

/// A tar block.
pub(crate) const TAR_BLOCK: usize = 512;
/// GNU tar's default record (blocking factor 20): archives are padded to it.
pub(crate) const TAR_RECORD: u64 = 10240;

/// Metadata of one archive member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TarEntry {
    /// Member path (directories end in `/`).
    pub path: String,
    /// Content bytes (0 for directories).
    pub size: u64,
    /// Modification time, seconds since the epoch.
    pub mtime: u64,
    /// Permission bits.
    pub mode: u32,
    /// `b'0'` for a regular file, `b'5'` for a directory.
    pub typeflag: u8,
}

fn octal(field: &mut [u8], v: u64) -> io::Result<()> {
    // `width - 1` octal digits and a NUL terminator.
    let digits = field.len() - 1;
    let s = format!("{v:0digits$o}");
    if s.len() > digits {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("value {v} does not fit a {digits}-digit tar field"),
        ));
    }
    field[..digits].copy_from_slice(s.as_bytes());
    field[digits] = 0;
    Ok(())
}

/// Splits `path` into ustar `prefix` (≤155 bytes) and `name` (≤100 bytes).
fn split_path(path: &str) -> io::Result<(&str, &str)> {
    if path.len() <= 100 {
        return Ok(("", path));
    }
    let bytes = path.as_bytes();
    // Split at a '/' such that the name part fits (directories keep their trailing '/').
    let search_end = bytes.len().saturating_sub(1);
    for (i, &b) in bytes[..search_end].iter().enumerate().rev() {
        if b == b'/' && i <= 155 && bytes.len() - i - 1 <= 100 {
            return Ok((&path[..i], &path[i + 1..]));
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("path {path:?} is too long for a ustar header"),
    ))
}

/// Encodes the 512-byte ustar header of `e`, with its checksum.
pub(crate) fn header(e: &TarEntry, uid: u32, user: &str) -> io::Result<[u8; TAR_BLOCK]> {
    let mut h = [0u8; TAR_BLOCK];
    let (prefix, name) = split_path(&e.path)?;
    h[..name.len()].copy_from_slice(name.as_bytes());
    octal(&mut h[100..108], u64::from(e.mode))?;
    octal(&mut h[108..116], u64::from(uid))?;
    octal(&mut h[116..124], u64::from(uid))?;
    octal(&mut h[124..136], e.size)?;
    octal(&mut h[136..148], e.mtime)?;
    h[156] = e.typeflag;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    let user = &user.as_bytes()[..user.len().min(31)];
    h[265..265 + user.len()].copy_from_slice(user);
    h[297..297 + user.len()].copy_from_slice(user);
    octal(&mut h[329..337], 0)?;
    octal(&mut h[337..345], 0)?;
    h[345..345 + prefix.len()].copy_from_slice(prefix.as_bytes());
    let sum = checksum(&h);
    // Six octal digits, NUL, space (the traditional layout).
    let s = format!("{sum:06o}");
    h[148..154].copy_from_slice(s.as_bytes());
    h[154] = 0;
    h[155] = b' ';
    Ok(h)
}

/// The header checksum: byte sum with the checksum field taken as spaces.
pub(crate) fn checksum(h: &[u8; TAR_BLOCK]) -> u32 {
    h.iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                32
            } else {
                u32::from(b)
            }
        })
        .sum()
}

fn parse_octal(field: &[u8]) -> Option<u64> {
    let s: Vec<u8> = field
        .iter()
        .copied()
        .take_while(|&b| b != 0)
        .filter(|&b| b != b' ')
        .collect();
    if s.is_empty() {
        return Some(0);
    }
    let s = std::str::from_utf8(&s).ok()?;
    u64::from_str_radix(s, 8).ok()
}

fn cstr(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// Parses the members of a ustar archive held in memory, verifying every
/// header checksum, the end-of-archive marker and the record padding.
pub fn parse_tar(data: &[u8]) -> Result<Vec<TarEntry>, String> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    loop {
        let Some(block) = data.get(pos..pos + TAR_BLOCK) else {
            return Err(format!("truncated archive at byte {pos}"));
        };
        if block.iter().all(|&b| b == 0) {
            let next = data.get(pos + TAR_BLOCK..pos + 2 * TAR_BLOCK);
            if !next.is_some_and(|b| b.iter().all(|&x| x == 0)) {
                return Err(format!("single zero block at byte {pos}"));
            }
            if !(data.len() as u64).is_multiple_of(TAR_RECORD) {
                return Err(format!("archive size {} is not a whole record", data.len()));
            }
            if data[pos..].iter().any(|&b| b != 0) {
                return Err("data after the end-of-archive marker".into());
            }
            return Ok(out);
        }
        let mut h = [0u8; TAR_BLOCK];
        h.copy_from_slice(block);
        let stored = parse_octal(&h[148..156]).ok_or(format!("bad checksum field at {pos}"))?;
        if stored != u64::from(checksum(&h)) {
            return Err(format!("checksum mismatch at byte {pos}"));
        }
        if &h[257..263] != b"ustar\0" {
            return Err(format!("no ustar magic at byte {pos}"));
        }
        let name = cstr(&h[..100]);
        let prefix = cstr(&h[345..500]);
        let path = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let size = parse_octal(&h[124..136]).ok_or(format!("bad size at {pos}"))?;
        let entry = TarEntry {
            path,
            size,
            mtime: parse_octal(&h[136..148]).ok_or(format!("bad mtime at {pos}"))?,
            mode: parse_octal(&h[100..108]).ok_or(format!("bad mode at {pos}"))? as u32,
            typeflag: h[156],
        };
        let padded = size.div_ceil(TAR_BLOCK as u64) * TAR_BLOCK as u64;
        pos += TAR_BLOCK + padded as usize;
        out.push(entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let long = format!("{}/{}", "d".repeat(120), "f".repeat(90));
        for path in ["a/b.txt".to_string(), long] {
            let e = TarEntry {
                path: path.clone(),
                size: 12345,
                mtime: 1_700_000_000,
                mode: 0o644,
                typeflag: b'0',
            };
            let h = header(&e, 1000, "user").unwrap();
            let mut data = h.to_vec();
            data.resize(TAR_BLOCK + 12345usize.div_ceil(512) * 512, 7);
            data.resize(data.len().div_ceil(10240) * 10240, 0);
            if data.len() - TAR_BLOCK - 12800 < 1024 {
                data.resize(data.len() + 10240, 0);
            }
            assert_eq!(parse_tar(&data).unwrap(), vec![e]);
            let mut bad = data.clone();
            bad[140] ^= 1;
            assert!(parse_tar(&bad).unwrap_err().contains("checksum"));
        }
        let too_long = "x".repeat(300);
        assert!(split_path(&too_long).is_err());
    }
}
