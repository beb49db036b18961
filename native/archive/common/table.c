/* table.c -- tables keyed by object address.
 *
 * Open addressing with linear probing, capacity a power of 2, at most half
 * full (pycds_addr_hash in pycds_internal.h): the writer's copy memo of one
 * chunk (object -> heap offset) and its set of the interned strings earlier
 * chunks hold, and the set of code objects a load has initialised
 * (layout_312_313.h).
 */
#include "pycds_internal.h"

#include <stdlib.h>
#include <string.h>

pycds_table_slot *
pycds_table_find(const pycds_table *t, const void *key)
{
    if (t->cap == 0) {
        return NULL;
    }
    size_t mask = t->cap - 1;
    for (size_t i = pycds_addr_hash(key, mask);; i = (i + 1) & mask) {
        if (t->slots[i].key == NULL) {
            return NULL;
        }
        if (t->slots[i].key == key) {
            return &t->slots[i];
        }
    }
}

int
pycds_table_get(const pycds_table *t, const void *key, uint64_t *value)
{
    pycds_table_slot *s = pycds_table_find(t, key);
    if (s == NULL) {
        return 0;
    }
    *value = s->value;
    return 1;
}

int
pycds_table_put(pycds_table *t, PyObject *key, uint64_t value)
{
    if ((t->used + 1) * 2 > t->cap) {
        size_t ncap = t->cap ? t->cap * 2 : 64;
        pycds_table_slot *ns = calloc(ncap, sizeof(pycds_table_slot));
        if (ns == NULL) {
            return pycds_fail(PYCDS_E_NOMEM, "cannot grow a table of %zu objects",
                              t->used);
        }
        for (size_t j = 0; j < t->cap; j++) {
            if (t->slots[j].key != NULL) {
                size_t i = pycds_addr_hash(t->slots[j].key, ncap - 1);
                while (ns[i].key != NULL) {
                    i = (i + 1) & (ncap - 1);
                }
                ns[i] = t->slots[j];
            }
        }
        free(t->slots);
        t->slots = ns;
        t->cap = ncap;
    }
    size_t mask = t->cap - 1;
    size_t i = pycds_addr_hash(key, mask);
    while (t->slots[i].key != NULL) {
        i = (i + 1) & mask;
    }
    t->slots[i].key = key;
    t->slots[i].value = value;
    t->used++;
    return PYCDS_OK;
}

void
pycds_table_clear(pycds_table *t)
{
    if (t->slots) {
        memset(t->slots, 0, t->cap * sizeof(pycds_table_slot));
    }
    t->used = 0;
}
