/*
 * src/server/tables.c - the table registry: the server's tables by id, the
 * copy of it each loop keeps, the reaper, and the emb_server_table_* calls
 * that in-process users (dump sessions, fills, checkpoints, metrics) hold
 * tables through.
 *
 * The registry is an array under a rwlock, written by create and drop;
 * each loop keeps a copy of it (struct srv_loop), refilled when the
 * registry's generation moved, so a request takes no lock and writes
 * nothing another loop reads (docs/architecture.md, "What loops share").
 * A table lives until its last reference goes: the registry's, each loop
 * cache's, and each request or reply using it, so a concurrent DROP_TABLE
 * cannot free memory a reply still names. Any thread may call in, except
 * where a function says "loop thread".
 */
#include "server/tables.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "common/err.h"
#include "common/init.h"
#include "common/log.h"
#include "common/optim.h"
#include "common/rowfmt.h"
#include "common/thread.h"

#include "server/memreg.h"
#include "server/server_int.h"
#include "server/slots.h"

_Thread_local struct srv_loop *emb__cur_loop;

struct srv_table *emb__tables_get(struct emb_server *s, uint32_t id)
{
	struct srv_table *st = NULL;

	if (id == 0 || id > s->opts.limits.max_tables)
		return NULL;
	pthread_rwlock_rdlock(&s->tables_lock);
	st = s->tables[id - 1];
	if (st)
		__atomic_fetch_add(&st->refs, 1, __ATOMIC_ACQ_REL);
	pthread_rwlock_unlock(&s->tables_lock);
	return st;
}

/*
 * Loop thread: refills l's cache from the registry after a create or a
 * drop (s->tables_gen moved). A table gone from a slot leaves its
 * reference to the last of this loop's users, if it has any left.
 */
static void loop_sync(struct srv_loop *l)
{
	struct emb_server *s = l->s;
	uint32_t ngone = 0;

	pthread_rwlock_rdlock(&s->tables_lock);
	l->gen = __atomic_load_n(&s->tables_gen, __ATOMIC_RELAXED);
	for (uint32_t i = 0; i < s->opts.limits.max_tables; i++) {
		struct srv_table *st = s->tables[i], *old = l->tabs[i];

		if (st == old)
			continue;
		if (st)
			__atomic_fetch_add(&st->refs, 1, __ATOMIC_ACQ_REL);
		l->tabs[i] = st;
		if (old && l->pins[i]) {
			struct orphan *o = malloc(sizeof(*o));

			/* Without memory the reference stays taken: a
			 * table leaked is better than one freed in use. */
			if (o) {
				o->st = old;
				o->pins = l->pins[i];
				o->next = l->orphans;
				l->orphans = o;
			}
		} else if (old) {
			/* Not chained through the table: every loop drops
			 * the same tables, each at its own time. */
			l->gone[ngone++] = old;
		}
		l->pins[i] = 0;
	}
	pthread_rwlock_unlock(&s->tables_lock);
	/* Outside the lock: a last put may free the table. */
	for (uint32_t i = 0; i < ngone; i++)
		emb__tables_put(l->gone[i]);
}

/*
 * Request path: table id for a request on loop l (or, on any other
 * thread, l NULL, with a reference of its own). On the loop it is the
 * loop's cached pointer, pinned for the request by a counter of the
 * loop's own: no lock, no shared write. NULL if there is none.
 */
static struct srv_table *ltable_get(struct srv_loop *l, struct emb_server *s,
				    uint32_t id)
{
	struct srv_table *st;

	if (!l)
		return emb__tables_get(s, id);
	if (id == 0 || id > s->opts.limits.max_tables)
		return NULL;
	/* One load of a line written only by creates and drops. */
	if (__atomic_load_n(&s->tables_gen, __ATOMIC_ACQUIRE) != l->gen)
		loop_sync(l);
	st = l->tabs[id - 1];
	if (st)
		l->pins[id - 1]++;
	return st;
}

void emb__tables_unpin_on(struct srv_loop *l, struct srv_table *st)
{
	struct orphan **pp;

	if (!st)
		return;
	if (!l) {
		emb__tables_put(st);
		return;
	}
	if (l->tabs[st->id - 1] == st) {
		l->pins[st->id - 1]--;
		return;
	}
	for (pp = &l->orphans; *pp; pp = &(*pp)->next) {
		struct orphan *o = *pp;

		if (o->st != st)
			continue;
		if (--o->pins == 0) {
			*pp = o->next;
			free(o);
			emb__tables_put(st);
		}
		return;
	}
}

int emb__tables_number(struct srv_table *st,
		       const struct emb_lifecycle_cfg *l)
{
	int rc;

	if (!emb_lifecycle_evicts(l))
		return 0;
	rc = emb_table_births_enable(st->t);
	return rc == -EOPNOTSUPP ? 0 : rc;
}

struct srv_table *emb__tables_pin(struct emb_server *s, uint32_t id)
{
	return ltable_get(emb__this_loop(s), s, id);
}

void emb__tables_unpin(struct srv_table *st)
{
	emb__tables_unpin_on(emb__this_loop(st->s), st);
}

void emb__tables_loop_fini(struct srv_loop *l)
{
	for (uint32_t i = 0; l->tabs && i < l->s->opts.limits.max_tables; i++)
		emb__tables_put(l->tabs[i]);
	while (l->orphans) {
		struct orphan *o = l->orphans;

		l->orphans = o->next;
		emb__tables_put(o->st);
		free(o);
	}
	free(l->tabs);
	free(l->pins);
	free(l->gone);
	l->tabs = NULL;
	l->pins = NULL;
	l->gone = NULL;
}

/* Task: a loop with no request to prompt it lets go of dropped tables. */
static void loop_sync_task(void *arg)
{
	struct srv_loop *l = arg;

	if (l->gen != __atomic_load_n(&l->s->tables_gen, __ATOMIC_ACQUIRE))
		loop_sync(l);
}

static void table_free(struct srv_table *st)
{
	pthread_mutex_lock(&st->s->reap_mu);
	*st->all_pprev = st->all_next;
	if (st->all_next)
		st->all_next->all_pprev = st->all_pprev;
	pthread_mutex_unlock(&st->s->reap_mu);
	emb_log(EMB_LOG_INFO, "table %s (id %u) freed", st->spec.name, st->id);
	emb__sync_destroy(st->sync);
	emb_table_destroy(st->t);
	emb__memreg_destroy(st->memreg);
	free(st);
}

void emb__tables_put(struct srv_table *st)
{
	struct emb_server *s;

	if (!st || __atomic_sub_fetch(&st->refs, 1, __ATOMIC_ACQ_REL) != 0)
		return;
	s = st->s;
	/* Deregistering RDMA regions waits for every loop, which a loop
	 * thread must not do: the reaper frees the table instead. */
	if (st->memreg && emb__memreg_on_loop()) {
		/* Without a reaper (stopping), emb_server_destroy() frees
		 * it once the loops are gone. */
		pthread_mutex_lock(&s->reap_mu);
		st->reap_next = s->reap_head;
		s->reap_head = st;
		pthread_cond_signal(&s->reap_cv);
		pthread_mutex_unlock(&s->reap_mu);
		return;
	}
	table_free(st);
}

static void *reaper_main(void *arg)
{
	struct emb_server *s = arg;

	pthread_mutex_lock(&s->reap_mu);
	for (;;) {
		struct srv_table *st = s->reap_head;

		if (st) {
			s->reap_head = st->reap_next;
			pthread_mutex_unlock(&s->reap_mu);
			table_free(st);
			pthread_mutex_lock(&s->reap_mu);
			continue;
		}
		if (s->reap_stop)
			break;
		pthread_cond_wait(&s->reap_cv, &s->reap_mu);
	}
	pthread_mutex_unlock(&s->reap_mu);
	return NULL;
}

static bool same_spec(const struct emb_wire_spec *a,
		      const struct emb_wire_spec *b)
{
	return a->dim == b->dim && a->seed == b->seed &&
	       a->row_format == b->row_format && a->rounding == b->rounding &&
	       memcmp(&a->optim, &b->optim, sizeof(a->optim)) == 0 &&
	       memcmp(&a->init, &b->init, sizeof(a->init)) == 0;
}

static int optim_str(const struct emb_optim_cfg *o, char *buf, size_t cap)
{
	return snprintf(buf, cap,
			"%s:lr=%g,wd=%g,acc=%g,beta1=%g,beta2=%g,eps=%g,"
			"beta=%g,l1=%g,l2=%g",
			emb_optim_name(o->kind), (double)o->lr,
			(double)o->weight_decay, (double)o->initial_accumulator,
			(double)o->beta1, (double)o->beta2, (double)o->eps,
			(double)o->ftrl_beta, (double)o->l1, (double)o->l2);
}

int emb__tables_spec_diff(struct emb_server *s,
			  const struct emb_wire_spec *spec, char *buf,
			  size_t cap)
{
	const struct emb_wire_spec *have = NULL;
	char a[160], b[160];
	int n = -1;

	pthread_rwlock_rdlock(&s->tables_lock);
	for (uint32_t i = 0; i < s->opts.limits.max_tables && !have; i++)
		if (s->tables[i] && strcmp(s->tables[i]->spec.name,
					   spec->name) == 0)
			have = &s->tables[i]->spec;
	if (!have) {
		n = -1;
	} else if (have->row_format != spec->row_format ||
		   have->rounding != spec->rounding) {
		n = snprintf(buf, cap,
			     "table %s exists with row format %s (%s "
			     "rounding); this CREATE asks %s (%s rounding)",
			     spec->name, emb_rowfmt_name(have->row_format),
			     have->rounding ? "nearest" : "stochastic",
			     emb_rowfmt_name(spec->row_format),
			     spec->rounding ? "nearest" : "stochastic");
	} else if (have->dim != spec->dim) {
		n = snprintf(buf, cap,
			     "table %s exists with dim %u; this CREATE asks "
			     "dim %u",
			     spec->name, have->dim, spec->dim);
	} else if (memcmp(&have->optim, &spec->optim, sizeof(have->optim))) {
		optim_str(&have->optim, a, sizeof(a));
		optim_str(&spec->optim, b, sizeof(b));
		n = snprintf(buf, cap,
			     "table %s exists with optimizer %s; this CREATE "
			     "asks %s",
			     spec->name, a, b);
	} else if (memcmp(&have->init, &spec->init, sizeof(have->init))) {
		n = snprintf(buf, cap,
			     "table %s exists with initializer %s a=%g b=%g; "
			     "this CREATE asks %s a=%g b=%g",
			     spec->name, emb_init_name(have->init.kind),
			     (double)have->init.a, (double)have->init.b,
			     emb_init_name(spec->init.kind),
			     (double)spec->init.a, (double)spec->init.b);
	} else if (have->seed != spec->seed) {
		n = snprintf(buf, cap,
			     "table %s exists with seed %llu; this CREATE "
			     "asks seed %llu",
			     spec->name, (unsigned long long)have->seed,
			     (unsigned long long)spec->seed);
	}
	pthread_rwlock_unlock(&s->tables_lock);
	return n < 0 ? -1 : 0;
}

/*
 * A CREATE of an existing table: a policy it carries is set only if the
 * table has none and either the client has admin rights or the table is
 * one the server made from a checkpoint (which keeps no policy) that no
 * CREATE has claimed yet, so a restarted server gets its policy back from
 * the first worker. Otherwise changing a policy stays SET_LIFECYCLE's,
 * which needs admin rights: a training client cannot, say, put max_rows:1
 * on a live table. Caller holds tables_lock for writing.
 */
static int adopt_lifecycle(struct srv_table *st,
			   const struct emb_wire_spec *spec, bool admin)
{
	struct emb_table_opts o;
	char a[EMB_LIFECYCLE_STR_MAX], e[EMB_LIFECYCLE_STR_MAX];
	bool unclaimed = st->life_unclaimed;
	int rc;

	st->life_unclaimed = false;
	if (emb_lifecycle_is_off(&spec->life) || (!admin && !unclaimed))
		return 0;
	emb_table_get_opts(st->t, &o);
	if (!emb_lifecycle_is_off(&o.life))
		return 0;
	rc = emb__tables_number(st, &spec->life);
	if (!rc)
		rc = emb_table_set_lifecycle(st->t, &spec->life);
	if (rc)
		return rc;
	emb_admit_format(&spec->life, a, sizeof(a));
	emb_evict_format(&spec->life, e, sizeof(e));
	emb_log(EMB_LOG_INFO, "table %s: admit %s, evict %s (from a CREATE)",
		spec->name, a, e);
	return 0;
}

/*
 * A tiered table's file: DIR/<name>.<pid>.<id>.tier (names are of
 * [A-Za-z0-9_.-]). The pid keeps servers that share DIR apart; the store
 * holds a lock on the file while it lives, so a later server can tell a
 * dead one's file (emb__tier_dir_sweep).
 */
static void tier_path(const char *dir, const char *name, uint32_t id,
		      char *out, size_t cap)
{
	snprintf(out, cap, "%s/%s.%ld.%u.tier", dir, name, (long)getpid(),
		 id);
}

/*
 * Where a new table's rows past the memory limit go: the server's tier,
 * unless its CREATE says off; a table that asks for a tier on a server
 * without one is refused (EMB_ENOTIER) rather than made all-DRAM behind
 * its back. Its tier file is bounded by the smaller of the server's
 * --tier-max and the table's own bound, each 0 for none; the table's is
 * kept in whole MiB, as checkpoints keep it (docs/format.md).
 */
static int tier_opts(const struct emb_server *s,
		     const struct emb_wire_spec *spec, uint32_t id, char *path,
		     size_t cap, struct emb_table_opts *o)
{
	uint64_t mine = spec->tier_max;

	if (spec->tier >= EMB_TIER_MODE_COUNT)
		return EMB_EBADARG;
	if (mine > (uint64_t)(UINT32_MAX >> 2) << 20)
		return EMB_EBADARG; /* past what a checkpoint can say */
	mine = (mine + (1u << 20) - 1) & ~(uint64_t)((1u << 20) - 1);
	o->tier_mode = spec->tier;
	o->tier_request = mine;
	if (spec->tier == EMB_TIER_OFF)
		return 0;
	if (!s->tier_dir)
		return spec->tier == EMB_TIER_ON ? EMB_ENOTIER : 0;
	tier_path(s->tier_dir, spec->name, id, path, cap);
	o->tier_path = path;
	o->tier_max = s->opts.tier_max;
	if (mine && (!o->tier_max || mine < o->tier_max))
		o->tier_max = mine;
	return 0;
}

int emb__tier_dir_sweep(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int removed = 0;

	if (!d) {
		int rc = -errno;

		emb_log(EMB_LOG_ERROR, "--tier-dir %s: %s", dir,
			strerror(errno));
		return rc;
	}
	if (access(dir, W_OK) != 0) {
		int rc = -errno;

		emb_log(EMB_LOG_ERROR, "--tier-dir %s: %s", dir,
			strerror(errno));
		closedir(d);
		return rc;
	}
	while ((e = readdir(d))) {
		size_t n = strlen(e->d_name);
		int fd;

		if (n < 6 || strcmp(e->d_name + n - 5, ".tier"))
			continue;
		fd = openat(dirfd(d), e->d_name, O_RDWR | O_CLOEXEC);
		if (fd < 0)
			continue;
		/* Locked: a live table's. Not: a dead process's scratch. */
		if (flock(fd, LOCK_EX | LOCK_NB) == 0 &&
		    unlinkat(dirfd(d), e->d_name, 0) == 0)
			removed++;
		close(fd);
	}
	closedir(d);
	if (removed)
		emb_log(EMB_LOG_INFO, "--tier-dir %s: removed %d tier file%s "
				      "of a process gone",
			dir, removed, removed == 1 ? "" : "s");
	return 0;
}

/*
 * admin: the caller's rights (adopt_lifecycle); own: the server makes the
 * table itself (a checkpoint load), so a CREATE may still give it a policy.
 */
int emb__tables_create(struct emb_server *s, const struct emb_wire_spec *spec,
		       uint32_t *id_out, bool admin, bool own)
{
	char tpath[4096];
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	struct srv_table *st;
	uint32_t i, free_slot = UINT32_MAX;
	int rc;

	pthread_rwlock_wrlock(&s->tables_lock);
	for (i = 0; i < s->opts.limits.max_tables; i++) {
		st = s->tables[i];
		if (!st) {
			if (free_slot == UINT32_MAX)
				free_slot = i;
			continue;
		}
		if (strcmp(st->spec.name, spec->name) == 0) {
			rc = same_spec(&st->spec, spec) ? 0 : EMB_ETABLEEXISTS;
			if (!rc)
				rc = adopt_lifecycle(st, spec, admin);
			*id_out = st->id;
			goto out_unlock;
		}
	}
	if (free_slot == UINT32_MAX) {
		rc = EMB_ETOOMANYTABLES;
		goto out_unlock;
	}
	st = calloc(1, sizeof(*st));
	if (!st) {
		rc = -ENOMEM;
		goto out_unlock;
	}
	o.name = spec->name;
	o.dim = spec->dim;
	o.optim = spec->optim;
	o.init = spec->init;
	o.seed = spec->seed;
	o.nshards = s->opts.table_shards;
	o.budget = &s->budget;
	o.life = spec->life;
	o.remote_read = s->opts.remote_read;
	o.row_format = spec->row_format;
	o.rounding = spec->rounding;
	rc = tier_opts(s, spec, free_slot + 1, tpath, sizeof(tpath), &o);
	if (rc) {
		free(st);
		goto out_unlock;
	}
	rc = emb_table_create(&o, &st->t);
	if (rc) {
		free(st);
		goto out_unlock;
	}
	emb_table_evict_hold(st->t, s->evict_hold);
	emb_table_lead(st->t, s->lead);
	/* In a map, a move may walk the table by slot: its slot index is
	 * made now, empty, and kept as rows come, not in a pass over all
	 * records at the first move's start, which that chunk's stream
	 * waited for (at 6.7M rows a chunk of 32 slots took 224 to 351 ms
	 * with it, 63 without: docs/store.md, "The slot index"). Not made,
	 * the walk makes it as before. */
	if (emb__slots_on(s->slots))
		(void)emb_table_slot_index(st->t);
	st->s = s;
	rc = emb__tables_number(st, &spec->life);
	if (rc) {
		emb_table_destroy(st->t);
		free(st);
		goto out_unlock;
	}
	st->life_unclaimed = own && emb_lifecycle_is_off(&spec->life);
	if (s->rdma) {
		rc = emb__memreg_create(s->loops, s->opts.threads,
					&s->loops_stopped, &st->memreg);
		if (!rc)
			rc = emb_table_set_extent_hook(st->t, emb__memreg_hook,
						       st->memreg);
		if (rc) {
			emb_table_destroy(st->t);
			emb__memreg_destroy(st->memreg);
			free(st);
			goto out_unlock;
		}
	}
	rc = emb__sync_create(spec->dim, &s->budget, s->sync_ack, s, &st->sync);
	if (rc) {
		emb_table_destroy(st->t);
		emb__memreg_destroy(st->memreg);
		free(st);
		goto out_unlock;
	}
	st->spec = *spec;
	st->id = free_slot + 1;
	st->refs = 1;
	pthread_mutex_lock(&s->reap_mu);
	st->all_next = s->all_tables;
	if (st->all_next)
		st->all_next->all_pprev = &st->all_next;
	st->all_pprev = &s->all_tables;
	s->all_tables = st;
	pthread_mutex_unlock(&s->reap_mu);
	s->tables[free_slot] = st;
	__atomic_add_fetch(&s->tables_gen, 1, __ATOMIC_RELEASE);
	*id_out = st->id;
	{
		char a[EMB_LIFECYCLE_STR_MAX], e[EMB_LIFECYCLE_STR_MAX];

		emb_admit_format(&spec->life, a, sizeof(a));
		emb_evict_format(&spec->life, e, sizeof(e));
		char tier[64] = "";

		if (o.tier_path && o.tier_max)
			snprintf(tier, sizeof(tier),
				 ", device tier up to %llu MiB",
				 (unsigned long long)(o.tier_max >> 20));
		else if (o.tier_path)
			snprintf(tier, sizeof(tier), ", device tier");
		else if (s->tier_dir)
			snprintf(tier, sizeof(tier), ", no device tier (off)");
		emb_log(EMB_LOG_INFO,
			"table %s (id %u) created: dim %u, %s, %s, admit %s, "
			"evict %s%s",
			spec->name, st->id, spec->dim,
			emb_optim_name(spec->optim.kind),
			emb_init_name(spec->init.kind), a, e, tier);
	}
out_unlock:
	pthread_rwlock_unlock(&s->tables_lock);
	return rc;
}

int emb__tables_drop(struct emb_server *s, uint32_t id)
{
	struct srv_table *st = NULL;

	if (id == 0 || id > s->opts.limits.max_tables)
		return EMB_ENOTABLE;
	pthread_rwlock_wrlock(&s->tables_lock);
	st = s->tables[id - 1];
	s->tables[id - 1] = NULL;
	if (st)
		__atomic_add_fetch(&s->tables_gen, 1, __ATOMIC_RELEASE);
	pthread_rwlock_unlock(&s->tables_lock);
	if (!st)
		return EMB_ENOTABLE;
	emb_log(EMB_LOG_INFO, "table %s (id %u) dropped", st->spec.name, id);
	/* Its memory lives on until the last request on it ends; a client
	 * that READs it meanwhile must not see rows of a dropped table. */
	emb_table_unseal_all(st->t);
	emb__tables_put(st);
	/* Every loop's cache holds a reference: loops that see no request
	 * soon let go of it through a task. Without one (no memory, or
	 * stopping) the reference goes at their next request or destroy. */
	for (uint32_t i = 0; i < s->nstarted; i++)
		if (&s->lstate[i] != emb__this_loop(s))
			(void)emb_transport_exec(s->loops[i], loop_sync_task,
						 &s->lstate[i]);
	if (emb__this_loop(s))
		loop_sync(emb__this_loop(s));
	return 0;
}

/* Tables for in-process users: dump sessions, checkpoints. */

uint32_t emb_server_table_ids(struct emb_server *s, uint32_t *ids, uint32_t cap)
{
	uint32_t n = 0;

	pthread_rwlock_rdlock(&s->tables_lock);
	for (uint32_t i = 0; i < s->opts.limits.max_tables; i++) {
		if (!s->tables[i])
			continue;
		if (n < cap)
			ids[n] = s->tables[i]->id;
		n++;
	}
	pthread_rwlock_unlock(&s->tables_lock);
	return n;
}

int emb_server_table_acquire(struct emb_server *s, uint32_t id,
			     struct emb_server_table *out)
{
	struct srv_table *st = emb__tables_get(s, id);

	if (!st)
		return EMB_ENOTABLE;
	out->t = st->t;
	out->spec = st->spec;
	out->id = st->id;
	out->ref = st;
	return 0;
}

void emb_server_table_release(struct emb_server_table *st)
{
	if (st && st->ref) {
		emb__tables_put(st->ref);
		st->ref = NULL;
	}
}

void emb_server_evict_hold(struct emb_server *s, const uint64_t *set)
{
	pthread_rwlock_wrlock(&s->tables_lock);
	memcpy(s->evict_hold, set, sizeof(s->evict_hold));
	for (uint32_t i = 0; i < s->opts.limits.max_tables; i++)
		if (s->tables[i])
			emb_table_evict_hold(s->tables[i]->t, set);
	pthread_rwlock_unlock(&s->tables_lock);
}

void emb_server_lead(struct emb_server *s, const uint64_t *set)
{
	pthread_rwlock_wrlock(&s->tables_lock);
	memcpy(s->lead, set, sizeof(s->lead));
	for (uint32_t i = 0; i < s->opts.limits.max_tables; i++)
		if (s->tables[i])
			emb_table_lead(s->tables[i]->t, set);
	pthread_rwlock_unlock(&s->tables_lock);
}

uint32_t emb_server_births_raise(struct emb_server *s, const uint64_t *set)
{
	uint32_t raised = 0;

	pthread_rwlock_rdlock(&s->tables_lock);
	for (uint32_t i = 0; i < s->opts.limits.max_tables; i++) {
		struct emb_table *t = s->tables[i] ? s->tables[i]->t : NULL;

		if (!t || !emb_table_has_births(t))
			continue;
		for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++) {
			uint32_t b;

			if (!((set[sl / 64] >> (sl % 64)) & 1))
				continue;
			/* 4096 promotions of a slot before the counter
			 * would wrap: it stops short instead. */
			b = emb_table_slot_birth(t, sl);
			b = b < EMB_BIRTH_NONE - 1 - EMB_SERVER_BIRTH_GAP
				? b + EMB_SERVER_BIRTH_GAP
				: EMB_BIRTH_NONE - 1;
			emb_table_slot_birth_raise(t, sl, b);
		}
		raised++;
	}
	pthread_rwlock_unlock(&s->tables_lock);
	return raised;
}

int emb_server_table_create(struct emb_server *s,
			    const struct emb_wire_spec *spec, uint32_t *id)
{
	return emb__tables_create(s, spec, id, true, true);
}

static void fill_stats(const struct srv_table *st, struct emb_wire_stats *w)
{
	struct emb_table_stats ts;

	emb_table_stats(st->t, &ts);
	w->table_id = st->id;
#define COPY(name, what) w->name = ts.name;
	EMB_TABLE_STATS(COPY)
#undef COPY
	/* Too stale by the step (bounded staleness), or by the row's birth
	 * (a row removed or made again since the client asked). */
	w->grads_discarded = emb__sync_discarded(st->sync) +
			     emb_table_births_dropped(st->t);
}

int emb_server_table_stats(struct emb_server *s, uint32_t id,
			   struct emb_wire_stats *out)
{
	struct srv_table *st = emb__tables_get(s, id);

	if (!st)
		return EMB_ENOTABLE;
	fill_stats(st, out);
	emb__tables_put(st);
	return 0;
}

uint32_t emb__tables_list(struct emb_server *s,
			  struct emb_wire_table_info *info, uint32_t cap)
{
	uint32_t n = 0;

	pthread_rwlock_rdlock(&s->tables_lock);
	for (uint32_t i = 0; i < s->opts.limits.max_tables && n < cap; i++) {
		struct srv_table *st = s->tables[i];
		struct emb_table_stats ts;

		if (!st)
			continue;
		emb_table_stats(st->t, &ts);
		info[n].table_id = st->id;
		info[n].spec = st->spec;
		info[n].rows = ts.rows;
		n++;
	}
	pthread_rwlock_unlock(&s->tables_lock);
	return n;
}

uint32_t emb__tables_stats(struct emb_server *s, uint32_t want,
			   struct emb_wire_stats *w, uint32_t cap)
{
	uint32_t n = 0;

	pthread_rwlock_rdlock(&s->tables_lock);
	for (uint32_t i = 0; i < s->opts.limits.max_tables && n < cap; i++) {
		struct srv_table *st = s->tables[i];

		if (st && (!want || want == st->id))
			fill_stats(st, &w[n++]);
	}
	pthread_rwlock_unlock(&s->tables_lock);
	return n;
}

uint64_t emb__tables_count(struct emb_server *s)
{
	uint64_t n = 0;

	pthread_rwlock_rdlock(&s->tables_lock);
	for (uint32_t i = 0; i < s->opts.limits.max_tables; i++)
		n += s->tables[i] != NULL;
	pthread_rwlock_unlock(&s->tables_lock);
	return n;
}

void emb__tables_drop_conn(struct emb_server *s, struct emb_conn *c)
{
	pthread_rwlock_rdlock(&s->tables_lock);
	for (uint32_t i = 0; i < s->opts.limits.max_tables; i++)
		if (s->tables[i])
			emb__sync_drop_conn(s->tables[i]->sync, c);
	pthread_rwlock_unlock(&s->tables_lock);
}

int emb__tables_reaper_start(struct emb_server *s)
{
	int rc = emb_thread_start(&s->reaper, NULL, reaper_main, s,
				  "emb-reap");

	if (!rc)
		s->reaper_running = true;
	return rc;
}

void emb__tables_reaper_stop(struct emb_server *s)
{
	if (!s->reaper_running)
		return;
	pthread_mutex_lock(&s->reap_mu);
	s->reap_stop = true;
	pthread_cond_signal(&s->reap_cv);
	pthread_mutex_unlock(&s->reap_mu);
	pthread_join(s->reaper, NULL);
	s->reaper_running = false;
}

void emb__tables_quiesce(struct emb_server *s)
{
	/* Tables left to the reaper after it stopped: the loops are gone,
	 * so this thread deregisters their regions itself. */
	while (s->reap_head) {
		struct srv_table *st = s->reap_head;

		s->reap_head = st->reap_next;
		table_free(st);
	}
	/* Regions must go before the transports that registered them; a
	 * table freed later (a reply completing at transport destroy) then
	 * finds none left. */
	for (struct srv_table *st = s->all_tables; st; st = st->all_next)
		emb__memreg_release_all(st->memreg);
	/* Held synchronous pushes name requests of connections that the
	 * transports free: release them while they exist. */
	for (uint32_t i = 0; i < s->opts.limits.max_tables; i++)
		if (s->tables[i])
			emb__sync_abort(s->tables[i]->sync);
}

void emb__tables_fini(struct emb_server *s)
{
	for (uint32_t i = 0; s->lstate && i < s->opts.threads; i++)
		emb__tables_loop_fini(&s->lstate[i]);
	for (uint32_t i = 0; s->tables && i < s->opts.limits.max_tables; i++)
		emb__tables_put(s->tables[i]);
}
