// Test seam of the I/O engine (storage/io_engine.h, storage/data_file_stream.h), testonly:
// linking //storage:direct_io_refusal replaces the engine's open(2) (io_internal::OpenFile,
// defined weak in storage/io_lane.cc) at link time with one that can refuse O_DIRECT with
// EINVAL, as filesystems without direct I/O do, so a test reaches the buffered fallback. The
// release engine links none of this: its open has no test on its path.
#ifndef CKPT_STORAGE_DIRECT_IO_REFUSAL_H_
#define CKPT_STORAGE_DIRECT_IO_REFUSAL_H_

namespace ckpt {

// While on, every O_DIRECT open of the engine fails with EINVAL (other opens are untouched).
void SetDirectIoRefusedForTesting(bool refused);

}  // namespace ckpt

#endif  // CKPT_STORAGE_DIRECT_IO_REFUSAL_H_
