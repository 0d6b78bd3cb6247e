/* offsets.c - see offsets.h. */
#include "common/offsets.h"

#include <stdlib.h>
#include <string.h>

#include "common/grow.h"

mfs_part_t *mfs_parts_find(const mfs_parts_t *t, const char *topic, int32_t partition)
{
	for (size_t j = 0; j < t->n; j++)
		if (t->p[j].off.partition == partition && strcmp(t->p[j].off.topic, topic) == 0)
			return &t->p[j];
	return NULL;
}

mfs_part_t *mfs_parts_get(mfs_parts_t *t, const char *topic, int32_t partition)
{
	mfs_part_t *p = mfs_parts_find(t, topic, partition);
	if (p)
		return p;
	char *name = strdup(topic);
	if (!name || mfs_grow((void **)&t->p, &t->cap, t->n + 1, sizeof *t->p)) {
		free(name);
		return NULL;
	}
	p = &t->p[t->n++];
	*p = (mfs_part_t){{name, partition, -1}, -1, 0, 0};
	return p;
}

void mfs_parts_free(mfs_parts_t *t)
{
	for (size_t j = 0; j < t->n; j++)
		free((void *)(uintptr_t)t->p[j].off.topic); /* the table's own copy (mfs_parts_get) */
	free(t->p);
	*t = (mfs_parts_t){0};
}
