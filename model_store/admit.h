/* admit.h - admission of new ids (model.admit_after): an id takes a row only once it has been
 * seen N times. Until then its events are dropped and counted (serve: events_dropped).
 *
 * The sightings are counted in a count-min sketch (Cormode and Muthukrishnan's, with
 * conservative update): MFS_ADMIT_ROWS rows of `width` 8-bit saturating counters, bounded
 * memory whatever the number of ids (4 x width bytes). An estimate never undercounts, so an id
 * is never admitted late; collisions can admit one early (a rare id sharing counters with
 * busier ones), which at 2^20 counters per row and a few million distinct ids seen is the
 * exception. Counts live in the process: after a restart an id that was seen but not admitted
 * starts counting again (docs/OPERATIONS.md, "Admission").
 */
#ifndef MFS_ADMIT_H
#define MFS_ADMIT_H

#include <stddef.h>
#include <stdint.h>

#define MFS_ADMIT_ROWS 4

typedef struct mfs_admit {
	uint8_t *c;   /* MFS_ADMIT_ROWS x width */
	size_t mask;  /* width - 1 (width a power of two) */
	uint64_t refused; /* sightings that did not (yet) admit their id */
} mfs_admit_t;

/** width: counters per row, rounded up to a power of two (>= 64). @return 0 or ENOMEM. */
int mfs_admit_init(mfs_admit_t *a, size_t width);
void mfs_admit_free(mfs_admit_t *a);
/** One more sighting of the id with hash h (mfs_idmap_hash); its estimated count after it
 *  (saturating at 255). */
unsigned mfs_admit_see(mfs_admit_t *a, uint64_t h);

#endif
