//! `ImageFolder`: images stored as `root/<class_name>/<file>.{jpg,jpeg,png}`
//! (the ImageNet / torchvision layout). Class directories sorted by name give
//! label indices; files within a class are sorted by name. Images are decoded
//! lazily in `get`, after their header's dimensions are checked against the
//! folder's [`ImageLimits`], and converted to RGB8.

use std::path::{Path, PathBuf};

use crate::dataset::check_index;
use crate::image_limits::decode_rgb;
use crate::{DataError, Dataset, ImageLimits, Sample};

/// File extensions (compared case-insensitively) that count as images.
pub const IMAGE_EXTENSIONS: [&str; 3] = ["jpg", "jpeg", "png"];

/// A dataset of image files grouped into one directory per class.
#[derive(Debug, Clone)]
pub struct ImageFolder {
    root: PathBuf,
    classes: Vec<String>,
    /// (path, label) for every image, classes in label order, files sorted.
    entries: Vec<(PathBuf, u32)>,
    limits: ImageLimits,
}

impl ImageFolder {
    /// Scans `root`: each subdirectory is a class; each class must hold at
    /// least one image file directly inside it (subdirectories are not searched).
    /// Images are bounded by the default [`ImageLimits`] ([`Self::with_limits`] changes them).
    pub fn open(root: impl AsRef<Path>) -> Result<Self, DataError> {
        let root = root.as_ref().to_path_buf();
        let mut classes = Vec::new();
        for entry in sorted_entries(&root)? {
            if entry.is_dir() {
                let name = entry.file_name().and_then(|n| n.to_str());
                let name = name.ok_or_else(|| DataError::InvalidFile {
                    path: entry.clone(),
                    reason: "class directory name is not valid UTF-8".to_string(),
                })?;
                classes.push(name.to_string());
            }
        }
        if classes.is_empty() {
            return Err(DataError::InvalidFile {
                path: root,
                reason: "no class directories found".to_string(),
            });
        }
        let mut entries = Vec::new();
        for (label, class) in classes.iter().enumerate() {
            let class_dir = root.join(class);
            let before = entries.len();
            for path in sorted_entries(&class_dir)? {
                if path.is_file() && has_image_extension(&path) {
                    entries.push((path, label as u32));
                }
            }
            if entries.len() == before {
                return Err(DataError::InvalidFile {
                    path: class_dir,
                    reason: format!(
                        "class directory holds no image files (extensions {IMAGE_EXTENSIONS:?})"
                    ),
                });
            }
        }
        Ok(Self {
            root,
            classes,
            entries,
            limits: ImageLimits::default(),
        })
    }

    /// The same folder, its images bounded by `limits`.
    pub fn with_limits(mut self, limits: ImageLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The bounds on the images `get` decodes.
    pub fn limits(&self) -> &ImageLimits {
        &self.limits
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Class names; `classes()[label]` is the directory of that label.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// The file of sample `index`.
    pub fn path(&self, index: usize) -> Result<&Path, DataError> {
        check_index(index, self.len())?;
        Ok(&self.entries[index].0)
    }
}

/// The entries of directory `dir`, sorted by path.
fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>, DataError> {
    let io_error = |source| DataError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_error)? {
        paths.push(entry.map_err(io_error)?.path());
    }
    paths.sort();
    Ok(paths)
}

fn has_image_extension(path: &Path) -> bool {
    path.extension().and_then(|e| e.to_str()).is_some_and(|e| {
        IMAGE_EXTENSIONS
            .iter()
            .any(|known| e.eq_ignore_ascii_case(known))
    })
}

impl Dataset for ImageFolder {
    fn len(&self) -> usize {
        self.entries.len()
    }

    fn get(&self, index: usize) -> Result<Sample, DataError> {
        check_index(index, self.len())?;
        let (path, label) = &self.entries[index];
        Ok(Sample {
            image: decode_rgb(path, &self.limits)?,
            label: *label,
        })
    }

    fn num_classes(&self) -> usize {
        self.classes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_images::write_png;

    /// root/cat/{a.png 3x2, b.png 4x4}, root/ant/{z.png 2x5, y.PNG 1x1}, plus a non-image file.
    fn two_class_tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for class in ["cat", "ant"] {
            std::fs::create_dir(dir.path().join(class)).unwrap();
        }
        write_png(&dir.path().join("cat/a.png"), 3, 2, [10, 20, 30]);
        write_png(&dir.path().join("cat/b.png"), 4, 4, [1, 2, 3]);
        write_png(&dir.path().join("ant/z.png"), 2, 5, [200, 100, 0]);
        write_png(&dir.path().join("ant/y.PNG"), 1, 1, [5, 5, 5]);
        std::fs::write(dir.path().join("ant/notes.txt"), "not an image").unwrap();
        dir
    }

    #[test]
    fn labels_follow_sorted_classes_and_files() {
        let dir = two_class_tree();
        let data = ImageFolder::open(dir.path()).unwrap();
        assert_eq!(data.classes(), ["ant", "cat"]);
        assert_eq!((data.len(), data.num_classes()), (4, 2));
        let expected = [
            ("ant/y.PNG", 0, 1, 1, [5, 5, 5]),
            ("ant/z.png", 0, 2, 5, [200, 100, 0]),
            ("cat/a.png", 1, 3, 2, [10, 20, 30]),
            ("cat/b.png", 1, 4, 4, [1, 2, 3]),
        ];
        for (index, (file, label, width, height, rgb)) in expected.into_iter().enumerate() {
            assert_eq!(data.path(index).unwrap(), dir.path().join(file));
            let sample = data.get(index).unwrap();
            assert_eq!(sample.label, label);
            assert_eq!(
                (sample.image.width(), sample.image.height()),
                (width, height)
            );
            assert_eq!(sample.image.pixel(width - 1, height - 1), rgb);
        }
    }

    #[test]
    fn corrupt_image_is_an_error_naming_the_path() {
        let dir = two_class_tree();
        let corrupt = dir.path().join("cat/broken.jpg");
        std::fs::write(&corrupt, b"\xFF\xD8\xFF\xE0 definitely not a jpeg").unwrap();
        let data = ImageFolder::open(dir.path()).unwrap();
        let index = (0..data.len())
            .find(|&i| data.path(i).unwrap() == corrupt)
            .unwrap();
        let err = data.get(index).unwrap_err();
        assert!(matches!(err, DataError::Decode { .. }), "{err:?}");
        assert!(
            err.to_string().contains(&corrupt.display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn an_oversized_image_is_refused_in_one_line_naming_it() {
        let dir = two_class_tree();
        let tall = dir.path().join("cat/tall.png");
        write_png(&tall, 1, 100_000, [0, 0, 0]);
        let data = ImageFolder::open(dir.path()).unwrap();
        assert_eq!(data.limits(), &ImageLimits::default());
        let index = (0..data.len())
            .find(|&i| data.path(i).unwrap() == tall)
            .unwrap();
        let err = data.get(index).unwrap_err().to_string();
        let expected = format!(
            "{}: image 1x100000 refused before decoding: its longer side 100000 exceeds 16384 \
             (ImageLimits::max_side)",
            tall.display()
        );
        assert_eq!(err, expected);
        let data = data.with_limits(ImageLimits {
            max_side: 100_000,
            max_aspect_ratio: 100_000,
            ..ImageLimits::default()
        });
        assert_eq!(data.get(index).unwrap().image.height(), 100_000);
    }

    #[test]
    fn missing_root_empty_root_and_empty_class_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let err = ImageFolder::open(&missing).unwrap_err().to_string();
        assert!(err.contains(&missing.display().to_string()), "{err}");
        let err = ImageFolder::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("no class directories"), "{err}");
        std::fs::create_dir(dir.path().join("empty_class")).unwrap();
        let err = ImageFolder::open(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("empty_class") && err.contains("no image files"),
            "{err}"
        );
    }
}
