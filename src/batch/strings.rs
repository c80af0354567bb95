//! A column of strings held as Arrow holds one: every row's text in one
//! buffer and where each row ends. A step of a million rows is then three
//! buffers a column, not a million strings: read from an Arrow batch in a
//! copy or two, written back to Arrow the same way, and freed at once (as
//! `Vec<String>`s, allocating, reading and freeing them was a third of a
//! 1M-row step's CPU).

use std::fmt;
use std::ops::{Index, Range};

use arrow_array::StringArray;
use arrow_buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::ArrowError;

/// Strings, one a row, in one buffer.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Strings {
    text: String,
    /// Where each row's text ends in `text` (it starts where the row
    /// before it ends).
    ends: Vec<usize>,
}

impl Strings {
    /// Room for `rows` rows of `bytes` bytes in all.
    pub fn with_capacity(rows: usize, bytes: usize) -> Self {
        Strings {
            text: String::with_capacity(bytes),
            ends: Vec::with_capacity(rows),
        }
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Bytes of text in all rows.
    pub fn text_len(&self) -> usize {
        self.text.len()
    }

    /// Bytes of text in the rows of `rows` (a difference of two ends).
    ///
    /// # Panics
    /// When `rows` runs past the last row.
    pub fn text_len_of(&self, rows: std::ops::Range<usize>) -> usize {
        if rows.is_empty() {
            return 0;
        }
        self.ends[rows.end - 1] - self.start(rows.start)
    }

    /// Bytes held, room included.
    pub fn capacity_bytes(&self) -> usize {
        self.text.capacity() + self.ends.capacity() * std::mem::size_of::<usize>()
    }

    /// Where row `row`'s text starts (the end of the text for `len()`).
    fn start(&self, row: usize) -> usize {
        if row == 0 {
            0
        } else {
            self.ends[row - 1]
        }
    }

    pub fn get(&self, row: usize) -> Option<&str> {
        let end = *self.ends.get(row)?;
        let start = self.start(row);
        Some(&self.text[start..end])
    }

    pub fn first(&self) -> Option<&str> {
        self.get(0)
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + Clone + '_ {
        (0..self.len()).map(|row| &self[row])
    }

    pub fn push(&mut self, value: &str) {
        self.text.push_str(value);
        self.ends.push(self.text.len());
    }

    /// Room for `rows` more rows of `bytes` more bytes in all.
    pub fn reserve(&mut self, rows: usize, bytes: usize) {
        self.text.reserve(bytes);
        self.ends.reserve(rows);
    }

    /// Gives back the room beyond its rows.
    pub fn shrink_to_fit(&mut self) {
        self.text.shrink_to_fit();
        self.ends.shrink_to_fit();
    }

    /// Whether `other`'s rows fit in the room left, so that
    /// [`Self::append`] of them moves nothing already held.
    pub fn has_room_for(&self, other: &Strings) -> bool {
        self.ends.capacity() - self.ends.len() >= other.len()
            && self.text.capacity() - self.text.len() >= other.text_len()
    }

    /// Drops the rows whose `gone` is true (one a row), in place: the
    /// others' text moves down, and the room stays.
    pub fn retain_rows(&mut self, gone: &[bool]) {
        let mut text = std::mem::take(&mut self.text).into_bytes();
        let (mut written, mut start, mut kept) = (0, 0, 0);
        for (row, &dropped) in gone.iter().enumerate().take(self.ends.len()) {
            let end = self.ends[row];
            if !dropped {
                if written != start {
                    text.copy_within(start..end, written);
                }
                written += end - start;
                self.ends[kept] = written;
                kept += 1;
            }
            start = end;
        }
        text.truncate(written);
        self.ends.truncate(kept);
        self.text = String::from_utf8(text).expect("whole rows of text moved");
    }

    /// Appends every row of `other`.
    pub fn append(&mut self, other: &Strings) {
        let base = self.text.len();
        self.text.push_str(&other.text);
        self.ends.extend(other.ends.iter().map(|end| base + end));
    }

    /// The rows at `indices`, in that order.
    pub fn take(&self, indices: &[usize]) -> Strings {
        let bytes = indices.iter().map(|&i| self[i].len()).sum();
        let mut out = Strings::with_capacity(indices.len(), bytes);
        for &i in indices {
            out.push(&self[i]);
        }
        out
    }

    /// Appends every row of an Arrow string array without nulls (callers
    /// reject nulls first: a null row's bytes are not defined): its values
    /// copied at once.
    pub fn extend_from_arrow(&mut self, array: &StringArray) {
        let offsets = array.value_offsets();
        let (first, last) = (offsets[0] as usize, offsets[offsets.len() - 1] as usize);
        // Arrow's values are UTF-8 row by row, hence as a whole.
        let Ok(text) = std::str::from_utf8(&array.value_data()[first..last]) else {
            self.extend(array.iter().map(Option::unwrap_or_default));
            return;
        };
        let base = self.text.len();
        self.text.push_str(text);
        self.ends
            .extend(offsets[1..].iter().map(|&end| base + (end as usize - first)));
    }

    /// The rows as an Arrow string array (its text copied once); an error
    /// when the text is over `i32::MAX` bytes, more than one array holds.
    pub fn to_arrow(&self) -> Result<StringArray, ArrowError> {
        self.to_arrow_range(0..self.len())
    }

    /// Rows `rows` as an Arrow string array of their own.
    ///
    /// # Panics
    /// When `rows` reaches past the last row.
    pub fn to_arrow_range(&self, rows: Range<usize>) -> Result<StringArray, ArrowError> {
        let (start, end) = (self.start(rows.start), self.start(rows.end));
        let text = &self.text[start..end];
        i32::try_from(text.len()).map_err(|_| ArrowError::OffsetOverflowError(text.len()))?;
        let offsets: Vec<i32> = std::iter::once(0)
            .chain(self.ends[rows].iter().map(|&end| (end - start) as i32))
            .collect();
        let offsets = OffsetBuffer::new(ScalarBuffer::from(offsets));
        StringArray::try_new(offsets, Buffer::from(text.as_bytes()), None)
    }
}

impl Index<usize> for Strings {
    type Output = str;

    fn index(&self, row: usize) -> &str {
        match self.get(row) {
            Some(value) => value,
            None => panic!("row {row} of {} strings", self.len()),
        }
    }
}

impl fmt::Debug for Strings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<S: AsRef<str>> Extend<S> for Strings {
    fn extend<I: IntoIterator<Item = S>>(&mut self, values: I) {
        for value in values {
            self.push(value.as_ref());
        }
    }
}

impl<S: AsRef<str>> FromIterator<S> for Strings {
    fn from_iter<I: IntoIterator<Item = S>>(values: I) -> Self {
        let mut out = Strings::default();
        out.extend(values);
        out
    }
}

impl<S: AsRef<str>> From<Vec<S>> for Strings {
    fn from(values: Vec<S>) -> Self {
        values.into_iter().collect()
    }
}

impl<S: AsRef<str>> PartialEq<[S]> for Strings {
    fn eq(&self, other: &[S]) -> bool {
        self.len() == other.len() && self.iter().zip(other).all(|(a, b)| a == b.as_ref())
    }
}

impl<S: AsRef<str>, const N: usize> PartialEq<[S; N]> for Strings {
    fn eq(&self, other: &[S; N]) -> bool {
        *self == other[..]
    }
}

impl<S: AsRef<str>> PartialEq<Vec<S>> for Strings {
    fn eq(&self, other: &Vec<S>) -> bool {
        *self == other[..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_read_back_as_pushed_whatever_their_length() {
        let values = ["swe-task-1", "", "é∂", "a"];
        let strings: Strings = values.iter().collect();
        assert_eq!(strings.len(), 4);
        assert_eq!(strings.iter().collect::<Vec<_>>(), values);
        assert_eq!(&strings[2], "é∂");
        assert_eq!(strings.get(4), None);
        assert_eq!(strings.first(), Some("swe-task-1"));
        assert_eq!(format!("{strings:?}"), r#"["swe-task-1", "", "é∂", "a"]"#);
    }

    #[test]
    fn appended_taken_and_arrow_round_tripped_rows_keep_their_text() {
        let mut a: Strings = vec!["x", "yy"].into();
        a.append(&vec!["zzz", ""].into());
        assert_eq!(a, ["x", "yy", "zzz", ""]);
        assert_eq!(a.take(&[3, 0, 2]), ["", "x", "zzz"]);
        assert_ne!(a, ["x", "yy", "zzz"]);
        let arrow = a.to_arrow().unwrap();
        assert_eq!(arrow.iter().flatten().collect::<Vec<_>>(), ["x", "yy", "zzz", ""]);
        // A slice of an array starts its values past the buffer's start.
        let sliced = arrow.slice(1, 2);
        let mut b: Strings = vec!["w"].into();
        b.extend_from_arrow(&sliced);
        assert_eq!(b, ["w", "yy", "zzz"]);
    }

    #[test]
    fn the_text_of_a_range_of_rows_is_a_difference_of_ends() {
        let mut s = Strings::default();
        for v in ["ab", "", "cde", "f"] {
            s.push(v);
        }
        for start in 0..=4 {
            for end in start..=4 {
                let expected: usize = (start..end).map(|row| s[row].len()).sum();
                assert_eq!(s.text_len_of(start..end), expected, "{start}..{end}");
            }
        }
    }
}
