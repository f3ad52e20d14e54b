//! Reading a recipe reference by reference without holding it: the sealed
//! recipe (docs/FORMAT.md, "Recipes") is read in ranges of [`WINDOW`]
//! bytes and decoded as it comes, so that a pass over a version's chunks
//! (`check` of the lifecycle layout) needs memory for one window, not for
//! the version. [`crate::format::snapshot::RecipeWriter`] writes recipes the same
//! way; [`crate::format::snapshot::Recipe::decode`] reads them whole.
//!
//! The envelope's checksum and version are checked after the last
//! reference, and they come first when the recipe is damaged: the errors
//! are those [`crate::repo::Repository::recipe`] reports for the same
//! object, in the same order (checksum, version, decoding, backup id).

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::format::envelope::{self, HEADER_LEN, TRAILER_LEN};
use crate::format::snapshot::{
    recipe_key, BackupId, ChunkRef, MAX_ENCODED_REF_LEN, RECIPE_KIND, SNAPSHOT_VERSION,
};

/// Bytes of a recipe read per request.
const WINDOW: u64 = 4 << 20;

/// The payload of a sealed object read a window at a time, its CRC-32C
/// computed as it comes.
struct Payload<'a> {
    backend: &'a dyn Backend,
    key: &'a str,
    /// Offset of the next unread payload byte.
    at: u64,
    /// Offset of the payload's end (the trailer's start).
    end: u64,
    buf: Vec<u8>,
    pos: usize,
    crc: u32,
}

impl Payload<'_> {
    /// Reads the next window (at most `WINDOW` bytes), `None` at the end.
    fn read_window(&mut self) -> Result<Option<Vec<u8>>> {
        if self.at == self.end {
            return Ok(None);
        }
        let len = (self.end - self.at).min(WINDOW);
        let bytes = self.backend.read_range(self.key, self.at, len)?;
        if bytes.len() as u64 != len {
            return Err(Error::corrupt(self.key, "truncated recipe"));
        }
        self.crc = crc32c::crc32c_append(self.crc, &bytes);
        self.at += len;
        Ok(Some(bytes))
    }

    /// The unread bytes in memory, at least `need` of them unless the
    /// payload ends first.
    fn ahead(&mut self, need: usize) -> Result<&[u8]> {
        if self.buf.len() - self.pos < need {
            self.buf.drain(..self.pos);
            self.pos = 0;
            if let Some(more) = self.read_window()? {
                self.buf.extend_from_slice(&more);
            }
        }
        Ok(&self.buf[self.pos..])
    }

    /// Decodes the next value (postcard), at most `max_len` bytes.
    fn take<T: serde::de::DeserializeOwned>(
        &mut self,
        max_len: usize,
    ) -> Result<std::result::Result<T, postcard::Error>> {
        let ahead = self.ahead(max_len)?;
        let before = ahead.len();
        Ok(match postcard::take_from_bytes::<T>(ahead) {
            Ok((value, rest)) => {
                self.pos += before - rest.len();
                Ok(value)
            }
            Err(e) => Err(e),
        })
    }

    /// Reads the rest of the payload (for its checksum), then checks the
    /// trailer.
    fn finish(&mut self) -> Result<()> {
        while self.read_window()?.is_some() {}
        let trailer = self
            .backend
            .read_range(self.key, self.end, TRAILER_LEN as u64)?;
        if trailer.len() != TRAILER_LEN {
            return Err(Error::corrupt(self.key, "truncated recipe"));
        }
        if u32::from_le_bytes(envelope::le4(&trailer)) != self.crc {
            return Err(Error::corrupt(self.key, "checksum mismatch"));
        }
        Ok(())
    }
}

/// Calls `f` with each chunk reference of backup `id`'s recipe, in stream
/// order, and returns how many there were. The recipe is verified only
/// after the last reference: when this returns an error, `f` may have seen
/// references of a damaged recipe, so a caller acts on what `f` gathered
/// only once this returned `Ok`. An error of `f` stops the reading.
pub(crate) fn for_each_ref(
    backend: &dyn Backend,
    id: BackupId,
    mut f: impl FnMut(&ChunkRef) -> Result<()>,
) -> Result<u64> {
    let key = recipe_key(id);
    let size = match backend.size(&key) {
        Err(Error::NotFound(_)) => return Err(Error::NotFound(key)),
        r => r?,
    };
    let header = backend.read_range(&key, 0, size.min(HEADER_LEN as u64))?;
    let payload_len = envelope::check_header(&key, RECIPE_KIND, &header, size)?;
    let mut payload = Payload {
        backend,
        key: &key,
        at: HEADER_LEN as u64,
        end: HEADER_LEN as u64 + payload_len,
        buf: Vec::new(),
        pos: 0,
        crc: crc32c::crc32c(&header),
    };
    // A decoding error waits for the checksum and version (checked first
    // when the recipe is read whole).
    let mut decoded = || -> Result<std::result::Result<(BackupId, u64), postcard::Error>> {
        // The backup id and the number of references (two varints).
        let (backup, count) = match payload.take::<(BackupId, u64)>(20)? {
            Ok(prefix) => prefix,
            Err(e) => return Ok(Err(e)),
        };
        for _ in 0..count {
            match payload.take::<ChunkRef>(MAX_ENCODED_REF_LEN)? {
                Ok(c) => f(&c)?,
                Err(e) => return Ok(Err(e)),
            }
        }
        Ok(Ok((backup, count)))
    };
    let decoded = decoded()?;
    payload.finish()?;
    envelope::check_version(&key, &[SNAPSHOT_VERSION], &header)?;
    let (backup, count) =
        decoded.map_err(|e| Error::corrupt(&key, format!("undecodable recipe: {e}")))?;
    if backup != id {
        return Err(Error::corrupt(&key, format!("belongs to backup {backup}")));
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::ObjectStore;
    use crate::fingerprint::Fingerprint;
    use crate::format::snapshot::Recipe;

    fn recipe(id: BackupId, n: u64) -> Recipe {
        let chunks = (0..n)
            .map(|i| {
                let mut fp = [0u8; 32];
                fp[..8].copy_from_slice(&(i * 7919).to_le_bytes());
                ChunkRef {
                    fp: Fingerprint(fp),
                    // Varints of every length.
                    len: (i as u32).wrapping_mul(2_654_435_761) >> (i % 32),
                    container: i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (i % 64),
                }
            })
            .collect();
        Recipe { backup: id, chunks }
    }

    fn streamed(backend: &dyn Backend, id: BackupId) -> Result<Vec<ChunkRef>> {
        let mut out = Vec::new();
        let n = for_each_ref(backend, id, |c| {
            out.push(*c);
            Ok(())
        })?;
        assert_eq!(n, out.len() as u64);
        Ok(out)
    }

    /// What reading the recipe whole reports.
    fn whole(backend: &dyn Backend, id: BackupId) -> Result<Vec<ChunkRef>> {
        Recipe::decode(id, &backend.read(&recipe_key(id))?).map(|r| r.chunks)
    }

    #[test]
    fn streamed_recipes_read_as_whole_ones_even_damaged() {
        let dir = tempfile::tempdir().unwrap();
        let backend = crate::backend::Local::new(dir.path());
        // More references than one window holds, and an empty recipe.
        let big = recipe(7, 2 * WINDOW / 32 + 333);
        let good = big.encode().unwrap();
        assert!(good.len() as u64 > 2 * WINDOW);
        backend.write(&recipe_key(7), &good).unwrap();
        assert_eq!(streamed(&backend, 7).unwrap(), big.chunks);
        backend
            .write(&recipe_key(8), &recipe(8, 0).encode().unwrap())
            .unwrap();
        assert_eq!(streamed(&backend, 8).unwrap(), Vec::new());
        assert!(matches!(streamed(&backend, 9), Err(Error::NotFound(k)) if k == recipe_key(9)));
        // Another backup's recipe.
        backend.write(&recipe_key(9), &good).unwrap();
        let e = streamed(&backend, 9).unwrap_err();
        assert_eq!(e.to_string(), whole(&backend, 9).unwrap_err().to_string());
        assert!(e.to_string().contains("belongs to backup 7"), "{e}");
        let payload = &good[HEADER_LEN..good.len() - TRAILER_LEN];
        let reseal = |payload: &[u8], version: u32| envelope::seal(RECIPE_KIND, version, payload);
        let damaged: Vec<(&str, Vec<u8>)> = vec![
            ("a flipped byte in the last window", {
                let mut b = good.clone();
                let at = b.len() - 10;
                b[at] ^= 1;
                b
            }),
            ("a flipped byte in the first window", {
                let mut b = good.clone();
                b[HEADER_LEN + 3] ^= 0x80;
                b
            }),
            ("truncated", good[..good.len() - 7].to_vec()),
            ("shorter than an envelope", good[..9].to_vec()),
            ("an unknown version", reseal(payload, 9)),
            (
                "references missing (sealed)",
                reseal(&payload[..payload.len() - 100], 1),
            ),
            ("an overlong varint (sealed)", {
                let mut p = payload.to_vec();
                p[..12].fill(0xff);
                reseal(&p, 1)
            }),
            (
                "trailing bytes (sealed)",
                reseal(&[payload, &[1, 2, 3]].concat(), 1),
            ),
        ];
        for (what, bytes) in damaged {
            backend.write(&recipe_key(7), &bytes).unwrap();
            let expected = whole(&backend, 7).map_err(|e| e.to_string());
            assert_eq!(
                streamed(&backend, 7).map_err(|e| e.to_string()),
                expected,
                "{what}"
            );
        }
        // An error of the callback stops the reading.
        backend.write(&recipe_key(7), &good).unwrap();
        let mut seen = 0;
        let e = for_each_ref(&backend, 7, |_| {
            seen += 1;
            Err(Error::Pipeline("stop".into()))
        });
        assert!(matches!(e, Err(Error::Pipeline(_))) && seen == 1);
    }
}
