//! Validation folders checked against training's classes: an `ImageFolder`'s labels are the
//! positions of its classes in the sorted list, so a `val/` missing a class (or holding an
//! extra one) would silently shift every later label.

use std::path::Path;

use crate::{DataError, ImageFolder};

impl ImageFolder {
    /// Opens the validation folder `root` with this (training) folder's image limits, and
    /// checks that its classes are exactly this folder's ([`Self::ensure_same_classes`]).
    pub fn open_validation(&self, root: impl AsRef<Path>) -> Result<ImageFolder, DataError> {
        let val = ImageFolder::open(root)?.with_limits(*self.limits());
        self.ensure_same_classes(&val)?;
        Ok(val)
    }

    /// `Ok` if `val` has this folder's classes, so the same label means the same class in
    /// both; otherwise [`DataError::ClassMismatch`] naming the missing and extra classes.
    pub fn ensure_same_classes(&self, val: &ImageFolder) -> Result<(), DataError> {
        if self.classes() == val.classes() {
            return Ok(());
        }
        let not_in = |names: &[String], other: &[String]| -> Vec<String> {
            names
                .iter()
                .filter(|name| !other.contains(name))
                .cloned()
                .collect()
        };
        Err(DataError::ClassMismatch {
            train: self.root().to_path_buf(),
            val: val.root().to_path_buf(),
            missing: not_in(self.classes(), val.classes()),
            extra: not_in(val.classes(), self.classes()),
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::test_images::image_tree;
    use crate::{DataError, Dataset, ImageFolder, ImageLimits};

    #[test]
    fn a_validation_folder_with_the_training_classes_opens_with_its_limits() {
        let train = image_tree(&[("ant", "a.png"), ("bee", "b.png"), ("cat", "c.png")]);
        let val = image_tree(&[("ant", "x.png"), ("bee", "y.png"), ("cat", "z.png")]);
        let limits = ImageLimits {
            max_side: 100,
            ..ImageLimits::default()
        };
        let train = ImageFolder::open(train.path()).unwrap().with_limits(limits);
        let val = train.open_validation(val.path()).unwrap();
        assert_eq!(val.limits(), &limits);
        assert_eq!(val.get(2).unwrap().label, 2);
    }

    #[test]
    fn a_validation_folder_missing_a_class_is_one_line_naming_it() {
        let train = image_tree(&[("ant", "a.png"), ("bee", "b.png"), ("cat", "c.png")]);
        let val = image_tree(&[("ant", "x.png"), ("cat", "z.png")]);
        let train = ImageFolder::open(train.path()).unwrap();
        let err = train.open_validation(val.path()).unwrap_err();
        assert!(matches!(err, DataError::ClassMismatch { .. }), "{err:?}");
        let expected = format!(
            "{}: validation classes differ from the training classes of {}: missing [bee], \
             extra []",
            val.path().display(),
            train.root().display()
        );
        assert_eq!(err.to_string(), expected);
    }

    #[test]
    fn extra_classes_are_named_and_long_lists_shortened() {
        let names: Vec<String> = (0..13).map(|i| format!("c{i:02}")).collect();
        let files: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "f.png")).collect();
        let train = image_tree(&files[..1]);
        let val = image_tree(&files);
        let train = ImageFolder::open(train.path()).unwrap();
        let val = ImageFolder::open(val.path()).unwrap();
        let err = train.ensure_same_classes(&val).unwrap_err().to_string();
        assert!(
            err.ends_with(
                "missing [], extra [c01, c02, c03, c04, c05, c06, c07, c08, c09, c10, and 2 more]"
            ),
            "{err}"
        );
    }
}
