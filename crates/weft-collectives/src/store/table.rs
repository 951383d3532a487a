//! The store's keys. A key is either a value, written once by `set` (setting the same bytes
//! again is a no-op, any other bytes are refused), or a counter, created and changed only by
//! `add`; so no client can replace a rendezvous value (`shm/segment`, `nccl/id`,
//! `rank/<r>/info`) that others have read or are about to read. The table holds at most
//! [`StoreLimits::max_keys`] keys and [`StoreLimits::max_stored_bytes`] bytes of keys and
//! values. Errors are the one-line reasons sent to the client.

use std::collections::HashMap;

use crate::store::limits::StoreLimits;
use crate::store::protocol::{check_entry, check_key, shown};

struct Entry {
    value: Vec<u8>,
    counter: bool,
}

/// Keys and their values, within the store's limits.
pub(crate) struct Table {
    entries: HashMap<String, Entry>,
    bytes: usize,
    max_keys: usize,
    max_bytes: usize,
}

impl Table {
    pub(crate) fn new(limits: &StoreLimits) -> Table {
        Table {
            entries: HashMap::new(),
            bytes: 0,
            max_keys: limits.max_keys,
            max_bytes: limits.max_stored_bytes,
        }
    }

    /// The value or counter at `key`.
    pub(crate) fn get(&self, key: &str) -> Option<&[u8]> {
        self.entries.get(key).map(|entry| entry.value.as_slice())
    }

    /// Sets `key`, once.
    pub(crate) fn set(&mut self, key: String, value: Vec<u8>) -> Result<(), String> {
        check_entry(&key, &value)?;
        match self.entries.get(&key) {
            Some(entry) if entry.counter => Err(format!(
                "key {} is a counter, changed only by add",
                shown(&key)
            )),
            Some(entry) if entry.value == value => Ok(()),
            Some(_) => Err(format!(
                "key {} is already set to another value; keys are written once",
                shown(&key)
            )),
            None => {
                self.make_room(&key, key.len() + value.len())?;
                self.bytes += key.len() + value.len();
                self.entries.insert(
                    key,
                    Entry {
                        value,
                        counter: false,
                    },
                );
                Ok(())
            }
        }
    }

    /// Adds `delta` to the counter at `key` (created at 0) and returns the sum.
    pub(crate) fn add(&mut self, key: &str, delta: i64) -> Result<i64, String> {
        check_key(key)?;
        let current = match self.entries.get(key) {
            None => 0,
            Some(entry) if !entry.counter => {
                return Err(format!(
                    "key {} was set, not created by add; only counters can be added to",
                    shown(key)
                ))
            }
            Some(entry) => std::str::from_utf8(&entry.value)
                .ok()
                .and_then(|text| text.parse::<i64>().ok())
                .expect("counters hold the decimal integers written here"),
        };
        let sum = current.checked_add(delta).ok_or_else(|| {
            format!(
                "adding {delta} to counter {} at {current} overflows",
                shown(key)
            )
        })?;
        let value = sum.to_string().into_bytes();
        match self.entries.get_mut(key) {
            Some(entry) => {
                let grown = value.len().saturating_sub(entry.value.len());
                if self.bytes + grown > self.max_bytes {
                    return Err(self.full(key, grown));
                }
                self.bytes = self.bytes + value.len() - entry.value.len();
                entry.value = value;
            }
            None => {
                self.make_room(key, key.len() + value.len())?;
                self.bytes += key.len() + value.len();
                let entry = Entry {
                    value,
                    counter: true,
                };
                self.entries.insert(key.to_string(), entry);
            }
        }
        Ok(sum)
    }

    /// Refuses a new key of `bytes` bytes (key and value) past the limits.
    fn make_room(&self, key: &str, bytes: usize) -> Result<(), String> {
        if self.entries.len() >= self.max_keys {
            return Err(format!(
                "key {} refused: the store holds {} keys, its limit",
                shown(key),
                self.max_keys
            ));
        }
        if self.bytes + bytes > self.max_bytes {
            return Err(self.full(key, bytes));
        }
        Ok(())
    }

    fn full(&self, key: &str, bytes: usize) -> String {
        format!(
            "key {} refused: {bytes} more bytes would pass the store's limit of {} bytes ({} held)",
            shown(key),
            self.max_bytes,
            self.bytes
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::protocol::{MAX_KEY, MAX_VALUE};

    fn table(max_keys: usize, max_stored_bytes: usize) -> Table {
        Table::new(&StoreLimits {
            max_keys,
            max_stored_bytes,
            ..StoreLimits::default()
        })
    }

    #[test]
    fn values_are_written_once_and_counters_only_added_to() {
        let mut t = table(16, 1 << 10);
        t.set("shm/segment".into(), b"/weft-a".to_vec()).unwrap();
        t.set("shm/segment".into(), b"/weft-a".to_vec()).unwrap();
        let err = t
            .set("shm/segment".into(), b"/weft-b".to_vec())
            .unwrap_err();
        assert!(
            err.contains("\"shm/segment\"") && err.contains("written once"),
            "{err}"
        );
        assert_eq!(t.get("shm/segment"), Some(&b"/weft-a"[..]));
        let err = t.add("shm/segment", 1).unwrap_err();
        assert!(err.contains("\"shm/segment\""), "{err}");
        assert_eq!(t.add("n", 2).unwrap(), 2);
        assert_eq!(t.add("n", -12).unwrap(), -10);
        assert_eq!(t.get("n"), Some(&b"-10"[..]));
        let err = t.set("n".into(), b"-10".to_vec()).unwrap_err();
        assert!(err.contains("counter"), "{err}");
        assert!(t.add("n", i64::MAX).is_ok());
        assert!(t.add("n", 11).unwrap_err().contains("overflows"));
    }

    #[test]
    fn keys_and_bytes_are_bounded_and_counted_exactly() {
        let mut t = table(2, 20);
        t.set("a".into(), vec![0; 9]).unwrap();
        t.add("b", 5).unwrap();
        let err = t.set("c".into(), vec![]).unwrap_err();
        assert!(err.contains("\"c\"") && err.contains("2 keys"), "{err}");
        let mut t = table(8, 20);
        t.set("a".into(), vec![0; 9]).unwrap();
        t.add("b", 5).unwrap();
        assert_eq!(t.bytes, 12);
        t.add("b", 99_999_995).unwrap();
        assert_eq!(t.bytes, 20);
        let err = t.add("b", 900_000_000).unwrap_err();
        assert!(err.contains("limit of 20 bytes"), "{err}");
        let err = t.set("c".into(), vec![]).unwrap_err();
        assert!(
            err.contains("\"c\"") && err.contains("limit of 20 bytes"),
            "{err}"
        );
    }

    #[test]
    fn oversized_keys_and_values_are_named_with_their_limit() {
        let mut t = table(8, 8 << 20);
        let long = "k".repeat(MAX_KEY + 1);
        let err = t.set(long.clone(), vec![]).unwrap_err();
        assert!(
            err.contains(&MAX_KEY.to_string()) && err.contains("bytes)"),
            "{err}"
        );
        assert!(err.len() < 200, "{err}");
        assert!(t.add(&long, 1).is_err());
        let err = t.set("v".into(), vec![0; MAX_VALUE + 1]).unwrap_err();
        assert!(
            err.contains("\"v\"") && err.contains(&MAX_VALUE.to_string()),
            "{err}"
        );
        t.set("v".into(), vec![0; MAX_VALUE]).unwrap();
    }
}
