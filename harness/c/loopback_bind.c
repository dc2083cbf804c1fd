/* Loaded with LD_PRELOAD into a server we cannot configure (Kroxylicious 0.12.0's gateways
 * have no bind-address setting): a bind() to the wildcard address becomes a bind() to
 * loopback, so the server is reachable from this machine only, like every server the
 * harness starts. Other binds pass through unchanged.
 *
 * The server still asks its listening socket where it is bound (Kroxylicious looks a new
 * connection's gateway up by "wildcard or this address"), so getsockname() on a socket this
 * shim moved answers the wildcard address it was asked to bind. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_function)(int, const struct sockaddr *, socklen_t);
typedef int (*getsockname_function)(int, struct sockaddr *, socklen_t *);
typedef int (*close_function)(int);

/* The descriptors this shim moved to loopback, by number (a server has few listeners). */
#define TRACKED_DESCRIPTORS 65536
static unsigned char moved_to_loopback[TRACKED_DESCRIPTORS];

static void remember(int fd, unsigned char moved) {
    if (fd >= 0 && fd < TRACKED_DESCRIPTORS) {
        moved_to_loopback[fd] = moved;
    }
}

int bind(int fd, const struct sockaddr *address, socklen_t length) {
    static bind_function libc_bind;
    if (libc_bind == NULL) {
        libc_bind = (bind_function)dlsym(RTLD_NEXT, "bind");
    }
    remember(fd, 0);
    if (address != NULL && address->sa_family == AF_INET && length >= sizeof(struct sockaddr_in)) {
        struct sockaddr_in ipv4;
        memcpy(&ipv4, address, sizeof ipv4);
        if (ipv4.sin_addr.s_addr == htonl(INADDR_ANY)) {
            ipv4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            remember(fd, 1);
            return libc_bind(fd, (const struct sockaddr *)&ipv4, sizeof ipv4);
        }
    }
    if (address != NULL && address->sa_family == AF_INET6 && length >= sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 ipv6;
        memcpy(&ipv6, address, sizeof ipv6);
        if (IN6_IS_ADDR_UNSPECIFIED(&ipv6.sin6_addr)) {
            /* ::ffff:127.0.0.1 on a dual-stack socket: IPv4 clients of 127.0.0.1 still reach it,
             * nothing from another host does. */
            memset(&ipv6.sin6_addr, 0, sizeof ipv6.sin6_addr);
            ipv6.sin6_addr.s6_addr[10] = 0xff;
            ipv6.sin6_addr.s6_addr[11] = 0xff;
            ipv6.sin6_addr.s6_addr[12] = 127;
            ipv6.sin6_addr.s6_addr[15] = 1;
            remember(fd, 1);
            return libc_bind(fd, (const struct sockaddr *)&ipv6, sizeof ipv6);
        }
    }
    return libc_bind(fd, address, length);
}

int getsockname(int fd, struct sockaddr *address, socklen_t *length) {
    static getsockname_function libc_getsockname;
    if (libc_getsockname == NULL) {
        libc_getsockname = (getsockname_function)dlsym(RTLD_NEXT, "getsockname");
    }
    int result = libc_getsockname(fd, address, length);
    if (result != 0 || fd < 0 || fd >= TRACKED_DESCRIPTORS || !moved_to_loopback[fd]) {
        return result;
    }
    if (address->sa_family == AF_INET && *length >= sizeof(struct sockaddr_in)) {
        ((struct sockaddr_in *)address)->sin_addr.s_addr = htonl(INADDR_ANY);
    } else if (address->sa_family == AF_INET6 && *length >= sizeof(struct sockaddr_in6)) {
        memset(&((struct sockaddr_in6 *)address)->sin6_addr, 0, sizeof(struct in6_addr));
    }
    return result;
}

/* A closed descriptor's number may come back as a connection: forget that it was moved. */
int close(int fd) {
    static close_function libc_close;
    if (libc_close == NULL) {
        libc_close = (close_function)dlsym(RTLD_NEXT, "close");
    }
    remember(fd, 0);
    return libc_close(fd);
}
