/*
 * src/common/authlimit.c - per-address failed-HELLO counts (authlimit.h).
 * A small table searched linearly: only failures add entries, and the
 * oldest entry gives way when it is full. Any thread.
 */
#include "common/authlimit.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"

#define ADDR_MAX 64

struct peer {
	char addr[ADDR_MAX]; /* without the port; "" = unused */
	uint32_t fails;	     /* failures since the last success */
	uint64_t until_ms;   /* monotonic: no comparison before this */
	uint64_t last_ms;    /* last failure */
};

struct emb_authlimit {
	pthread_mutex_t mu;		  /* guards peers */
	struct peer peers[EMB_AUTH_PEERS]; /* remembered addresses */
};

int emb_authlimit_create(struct emb_authlimit **out)
{
	struct emb_authlimit *al = calloc(1, sizeof(*al));

	if (!al)
		return -ENOMEM;
	pthread_mutex_init(&al->mu, NULL);
	*out = al;
	return 0;
}

void emb_authlimit_destroy(struct emb_authlimit *al)
{
	if (!al)
		return;
	pthread_mutex_destroy(&al->mu);
	free(al);
}

/* "1.2.3.4:5" -> "1.2.3.4", "[::1]:5" -> "[::1]". */
static void strip_port(const char *peer, char *out)
{
	const char *colon = strrchr(peer, ':');
	size_t n = colon ? (size_t)(colon - peer) : strlen(peer);

	if (n >= ADDR_MAX)
		n = ADDR_MAX - 1;
	memcpy(out, peer, n);
	out[n] = '\0';
}

static struct peer *find(struct emb_authlimit *al, const char *addr)
{
	for (uint32_t i = 0; i < EMB_AUTH_PEERS; i++)
		if (al->peers[i].addr[0] && strcmp(al->peers[i].addr, addr) == 0)
			return &al->peers[i];
	return NULL;
}

uint32_t emb_authlimit_wait_ms(struct emb_authlimit *al, const char *peer)
{
	char addr[ADDR_MAX];
	uint64_t now = emb_clock_ms();
	uint32_t wait = 0;
	struct peer *p;

	strip_port(peer, addr);
	pthread_mutex_lock(&al->mu);
	p = find(al, addr);
	if (p && p->until_ms > now)
		wait = (uint32_t)(p->until_ms - now);
	pthread_mutex_unlock(&al->mu);
	return wait;
}

void emb_authlimit_fail(struct emb_authlimit *al, const char *peer)
{
	char addr[ADDR_MAX];
	uint64_t now = emb_clock_ms();
	struct peer *p;

	strip_port(peer, addr);
	pthread_mutex_lock(&al->mu);
	p = find(al, addr);
	if (!p) {
		p = &al->peers[0];
		for (uint32_t i = 1; i < EMB_AUTH_PEERS && p->addr[0]; i++)
			if (!al->peers[i].addr[0] ||
			    al->peers[i].last_ms < p->last_ms)
				p = &al->peers[i];
		memset(p, 0, sizeof(*p));
		strcpy(p->addr, addr);
	}
	/* A streak an hour old is not one. */
	if (now - p->last_ms > 3600000)
		p->fails = 0;
	p->fails++;
	p->last_ms = now;
	if (p->fails > EMB_AUTH_FREE_FAILS) {
		uint32_t k = p->fails - EMB_AUTH_FREE_FAILS - 1;
		uint64_t wait = k >= 5 ? EMB_AUTH_WAIT_MAX_MS
				       : (uint64_t)EMB_AUTH_WAIT_MIN_MS << k;

		if (wait > EMB_AUTH_WAIT_MAX_MS)
			wait = EMB_AUTH_WAIT_MAX_MS;
		p->until_ms = now + wait;
	}
	pthread_mutex_unlock(&al->mu);
}

void emb_authlimit_ok(struct emb_authlimit *al, const char *peer)
{
	char addr[ADDR_MAX];
	struct peer *p;

	strip_port(peer, addr);
	pthread_mutex_lock(&al->mu);
	p = find(al, addr);
	if (p)
		memset(p, 0, sizeof(*p));
	pthread_mutex_unlock(&al->mu);
}
