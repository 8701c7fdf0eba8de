// Page-fault counts for tests that prove an operation faults in no new memory (issue 40: pools
// touched once, then reused). Test-only (//common:page_faults is testonly).
//
// Under ThreadSanitizer the counts measure the sanitizer, not the code: it faults in shadow
// memory for an application page at its first access through instrumented code, so tests skip
// their bounds where kPageFaultsMeasureTheCode is false.
#ifndef CKPT_COMMON_PAGE_FAULTS_H_
#define CKPT_COMMON_PAGE_FAULTS_H_

#include <sys/resource.h>

#include <cstdint>

namespace ckpt {

#if defined(__SANITIZE_THREAD__)
inline constexpr bool kPageFaultsMeasureTheCode = false;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kPageFaultsMeasureTheCode = false;
#else
inline constexpr bool kPageFaultsMeasureTheCode = true;
#endif
#else
inline constexpr bool kPageFaultsMeasureTheCode = true;
#endif

// Minor page faults (a page mapped in without I/O: first touches of fresh memory) so far, of the
// calling thread (RUSAGE_THREAD) or of the whole process (RUSAGE_SELF).
inline int64_t ThreadMinorFaults() {
  struct rusage usage {};
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_minflt;
}
inline int64_t ProcessMinorFaults() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

}  // namespace ckpt

#endif  // CKPT_COMMON_PAGE_FAULTS_H_
