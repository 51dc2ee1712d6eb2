/*
 * examples/ctr/local.c - in-process tables for the trainer's --local mode:
 * rows in an open-addressing hash map (id -> row index) over one growing
 * array of rows (weights, then the optimizer's state), admission counters
 * in a second map. Only libembstore's public API is used. One thread per
 * table.
 */
#include "local.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ctr.h"

/* id -> 64-bit value, linear probing, at most 3/4 full. */
struct map {
	uint64_t *keys;	 /* id of each slot */
	uint64_t *vals;	 /* value of each slot */
	uint8_t *used;	 /* 1 where a slot holds an id */
	uint32_t mask;	 /* slots - 1; slots is a power of two */
	uint32_t n;	 /* ids held */
};

struct ctr_local {
	struct emb_table_spec spec; /* as created */
	uint32_t row_floats;	    /* dim + the optimizer's state */
	float *rows;		    /* nrows * row_floats floats */
	uint32_t nrows;		    /* rows made */
	uint32_t cap;		    /* rows room */
	struct map index;	    /* id -> row */
	struct map counts;	    /* id -> (call << 32) | sightings */
	uint32_t call;		    /* pulls so far: a sighting per call */
	float *sum;		    /* push: summed gradients, n * dim */
	uint32_t sum_cap;	    /* ids sum has room for */
	struct map first;	    /* push: id -> its gradient in sum */
};

static int map_init(struct map *m, uint32_t slots)
{
	m->keys = calloc(slots, sizeof(*m->keys));
	m->vals = calloc(slots, sizeof(*m->vals));
	m->used = calloc(slots, 1);
	m->mask = slots - 1;
	m->n = 0;
	return m->keys && m->vals && m->used ? 0 : -ENOMEM;
}

static void map_free(struct map *m)
{
	free(m->keys);
	free(m->vals);
	free(m->used);
}

static uint32_t map_slot(const struct map *m, uint64_t id)
{
	uint32_t i = (uint32_t)ctr_hash(id) & m->mask;

	while (m->used[i] && m->keys[i] != id)
		i = (i + 1) & m->mask;
	return i;
}

/* The value of id, or NULL. */
static uint64_t *map_get(struct map *m, uint64_t id)
{
	uint32_t i = map_slot(m, id);

	return m->used[i] ? &m->vals[i] : NULL;
}

static int map_put(struct map *m, uint64_t id, uint64_t val)
{
	uint32_t i;

	if (4 * ((uint64_t)m->n + 1) > 3 * ((uint64_t)m->mask + 1)) {
		struct map g;
		int rc = map_init(&g, 2 * (m->mask + 1));

		if (rc) {
			map_free(&g);
			return rc;
		}
		for (uint32_t k = 0; k <= m->mask; k++) {
			if (!m->used[k])
				continue;
			i = map_slot(&g, m->keys[k]);
			g.used[i] = 1;
			g.keys[i] = m->keys[k];
			g.vals[i] = m->vals[k];
			g.n++;
		}
		map_free(m);
		*m = g;
	}
	i = map_slot(m, id);
	if (!m->used[i]) {
		m->used[i] = 1;
		m->keys[i] = id;
		m->n++;
	}
	m->vals[i] = val;
	return 0;
}

/* Removes id (backward-shift deletion keeps every probe chain whole). */
static void map_del(struct map *m, uint64_t id)
{
	uint32_t i = map_slot(m, id), j = i;

	if (!m->used[i])
		return;
	for (;;) {
		uint32_t home;

		j = (j + 1) & m->mask;
		if (!m->used[j])
			break;
		home = (uint32_t)ctr_hash(m->keys[j]) & m->mask;
		/* j's entry may fill the hole at i unless its home lies
		 * cyclically in (i, j]. */
		if ((j > i && (home <= i || home > j)) ||
		    (j < i && home <= i && home > j)) {
			m->keys[i] = m->keys[j];
			m->vals[i] = m->vals[j];
			i = j;
		}
	}
	m->used[i] = 0;
	m->n--;
}

int ctr_local_create(const struct emb_table_spec *spec,
		     struct ctr_local **out)
{
	struct ctr_local *t;
	int rc;

	if (spec->dim == 0 || spec->dim > EMB_DIM_MAX)
		return EMB_EBADDIM;
	rc = emb_optim_validate(&spec->optim);
	if (!rc)
		rc = emb_init_validate(&spec->init);
	if (rc)
		return rc;
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->spec = *spec;
	t->row_floats =
	    spec->dim + emb_optim_state_floats(spec->optim.kind, spec->dim);
	rc = map_init(&t->index, 1024);
	if (!rc)
		rc = map_init(&t->counts, 1024);
	if (!rc)
		rc = map_init(&t->first, 1024);
	if (rc) {
		ctr_local_destroy(t);
		return rc;
	}
	*out = t;
	return 0;
}

void ctr_local_destroy(struct ctr_local *t)
{
	if (!t)
		return;
	map_free(&t->index);
	map_free(&t->counts);
	map_free(&t->first);
	free(t->rows);
	free(t->sum);
	free(t);
}

static float *row_at(struct ctr_local *t, uint64_t r)
{
	return t->rows + (size_t)r * t->row_floats;
}

/* A new row for id: initial weights and optimizer state. NULL: no memory. */
static float *row_new(struct ctr_local *t, uint64_t id)
{
	float *w;

	if (t->nrows == t->cap) {
		uint32_t cap = t->cap ? 2 * t->cap : 1024;
		float *rows = realloc(t->rows, (size_t)cap * t->row_floats *
						   sizeof(*rows));

		if (!rows)
			return NULL;
		t->rows = rows;
		t->cap = cap;
	}
	if (map_put(&t->index, id, t->nrows))
		return NULL;
	w = row_at(t, t->nrows++);
	emb_init_row(&t->spec.init, t->spec.seed, id, w, t->spec.dim);
	emb_optim_state_init(&t->spec.optim, w + t->spec.dim, t->spec.dim);
	return w;
}

/*
 * One sighting of absent id in this pull (a second one in the same call
 * does not count): true when it is admitted now. *rc on no memory.
 */
static bool admit(struct ctr_local *t, uint64_t id, int *rc)
{
	uint64_t *v = map_get(&t->counts, id);
	uint64_t n;

	if (!t->spec.life.admit)
		return true;
	if (v && (uint32_t)(*v >> 32) == t->call)
		return false;
	n = (v ? (uint32_t)*v : 0) + 1;
	if (n >= t->spec.life.admit_n) {
		map_del(&t->counts, id);
		return true;
	}
	*rc = map_put(&t->counts, id, ((uint64_t)t->call << 32) | n);
	return false;
}

int ctr_local_pull(struct ctr_local *t, const uint64_t *ids, uint32_t n,
		   float *out, bool create, uint8_t *found)
{
	const uint32_t dim = t->spec.dim;
	int rc = 0;

	t->call++;
	for (uint32_t i = 0; i < n && !rc; i++) {
		uint64_t *r = map_get(&t->index, ids[i]);
		float *o = out + (size_t)i * dim;
		const float *w = r ? row_at(t, *r) : NULL;

		if (!w && create) {
			if (!admit(t, ids[i], &rc)) {
				emb_init_row(&t->spec.init, t->spec.seed,
					     ids[i], o, dim);
				if (found)
					found[i] = 0;
				continue;
			}
			w = row_new(t, ids[i]);
			if (!w)
				return -ENOMEM;
		}
		if (w)
			memcpy(o, w, dim * sizeof(*o));
		else
			memset(o, 0, dim * sizeof(*o));
		if (found)
			found[i] = w != NULL;
	}
	return rc;
}

int ctr_local_push(struct ctr_local *t, const uint64_t *ids, uint32_t n,
		   const float *grads)
{
	const uint32_t dim = t->spec.dim;
	struct map *first = &t->first;
	uint32_t nu = 0;
	int rc = 0;

	if (n > t->sum_cap) {
		float *s = realloc(t->sum, (size_t)n * dim * sizeof(*s));

		if (!s)
			return -ENOMEM;
		t->sum = s;
		t->sum_cap = n;
	}
	memset(first->used, 0, (size_t)first->mask + 1);
	first->n = 0;
	/* Duplicates are summed, then one step per distinct id, as the
	 * servers do. */
	for (uint32_t i = 0; i < n && !rc; i++) {
		const float *g = grads + (size_t)i * dim;
		uint64_t *u = map_get(first, ids[i]);
		float *s;

		if (u) {
			s = t->sum + *u * dim;
			for (uint32_t k = 0; k < dim; k++)
				s[k] += g[k];
			continue;
		}
		rc = map_put(first, ids[i], nu);
		memcpy(t->sum + (size_t)nu++ * dim, g, dim * sizeof(*g));
	}
	for (uint32_t i = 0; i < n && !rc; i++) {
		uint64_t *u = map_get(first, ids[i]);
		uint64_t *r;
		float *w;

		if (*u == UINT64_MAX)
			continue; /* applied already */
		r = map_get(&t->index, ids[i]);
		if (r) {
			w = row_at(t, *r);
		} else if (t->spec.life.admit) {
			*u = UINT64_MAX; /* not admitted yet: dropped */
			continue;
		} else {
			w = row_new(t, ids[i]);
			if (!w) {
				rc = -ENOMEM;
				break;
			}
		}
		emb_optim_apply(&t->spec.optim, w, w + dim,
				t->sum + *u * dim, dim);
		*u = UINT64_MAX;
	}
	return rc;
}

int ctr_local_assign(struct ctr_local *t, const uint64_t *ids, uint32_t n,
		     const float *rows)
{
	const uint32_t dim = t->spec.dim;

	for (uint32_t i = 0; i < n; i++) {
		uint64_t *r = map_get(&t->index, ids[i]);
		float *w = r ? row_at(t, *r) : row_new(t, ids[i]);

		if (!w)
			return -ENOMEM;
		memcpy(w, rows + (size_t)i * dim, dim * sizeof(*w));
	}
	return 0;
}
