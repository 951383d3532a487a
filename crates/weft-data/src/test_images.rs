//! Test helpers: small image files and ImageFolder trees written into temporary folders.

use std::path::Path;

/// Writes a `width` x `height` PNG of one colour at `path`.
pub(crate) fn write_png(path: &Path, width: u32, height: u32, rgb: [u8; 3]) {
    image::RgbImage::from_pixel(width, height, image::Rgb(rgb))
        .save(path)
        .unwrap();
}

/// `root/<class>/<file>` for each `(class, file)`, each a 2x2 PNG whose colour is its position
/// in `files`; returns `root`'s guard.
pub(crate) fn image_tree(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (position, (class, file)) in files.iter().enumerate() {
        let class_dir = dir.path().join(class);
        std::fs::create_dir_all(&class_dir).unwrap();
        write_png(&class_dir.join(file), 2, 2, [position as u8; 3]);
    }
    dir
}
