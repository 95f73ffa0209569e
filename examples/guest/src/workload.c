/* qmpprof example guest: the profiling workload.
 *
 * Time is split by the timer tick counter (TIMER_HZ = 100, 10 ms/tick) into a
 * repeating cycle of PHASE_CYCLE_TICKS = 11 ticks:
 *
 *   ticks 0-4   physics chain  5/11 = 45.5 % of all time (50 % of busy time)
 *   ticks 5-7   render chain   3/11 = 27.3 %             (30 %)
 *   ticks 8-9   audio chain    2/11 = 18.2 %             (20 %)
 *   tick  10    idle (sti;hlt) 1/11 =  9.1 %
 *
 * minus the timer interrupt's own chain (timer.c, ~4-5 % under TCG), which
 * runs on top of all phases alike, so the 50/30/20 ratios do not change.
 *
 * Call chains (root -> leaf), each function a real frame:
 *   kernel_main -> workload_loop -> run_physics -> physics_step
 *               -> physics_compute_forces -> physics_leaf
 *   kernel_main -> workload_loop -> run_render -> render_frame
 *               -> render_draw_scene -> render_rasterize -> render_leaf
 *   kernel_main -> workload_loop -> run_audio -> audio_mix -> audio_leaf
 *   kernel_main -> workload_loop -> run_idle -> idle_halt
 *
 * Each leaf does a short burst of arithmetic (LEAF_ITERATIONS rounds, well
 * under a tick), bumps workload_progress once per round and returns, so the
 * chains are re-entered from workload_loop all the time. The leaves also
 * bail out early when their phase is over.
 */
#include "kernel.h"

#define PHASE_CYCLE_TICKS 11
#define LEAF_ITERATIONS   4096          /* ~20 us under TCG, a few us under KVM */
#define PHASE_CHECK_MASK  31            /* re-check the phase every 32 rounds */

enum workload_phase {
    PHASE_PHYSICS = 0,
    PHASE_RENDER = 1,
    PHASE_AUDIO = 2,
    PHASE_IDLE = 3,
};

/* Bumped once per leaf round (all three chains). Read it from outside to see
 * that the guest makes progress. */
volatile uint64_t workload_progress;
/* Phase workload_loop dispatched last (enum workload_phase). */
volatile uint32_t workload_phase;
/* Set to non-zero (e.g. from a debugger) to make workload_loop return. */
volatile uint32_t workload_stop;

/* Results of each chain, so that nothing is optimized away. */
static uint64_t physics_state = 0x9e3779b97f4a7c15ULL;
static uint64_t render_state = 0xbf58476d1ce4e5b9ULL;
static uint64_t audio_state = 0x94d049bb133111ebULL;

/* Phase of the current tick. A macro on purpose: as an (inlined) function it
 * would show up as an extra inline frame in debugger backtraces. */
#define CURRENT_PHASE()                                                    \
    ({                                                                     \
        uint64_t tick_ = timer_ticks % PHASE_CYCLE_TICKS;                  \
        tick_ < 5 ? PHASE_PHYSICS : tick_ < 8 ? PHASE_RENDER :             \
        tick_ < 10 ? PHASE_AUDIO : PHASE_IDLE;                             \
    })

/* ---------------- chain A: physics (5 of 11 ticks) ---------------- */

CHAIN_FN uint64_t physics_leaf(uint64_t x)
{
    for (unsigned i = 0; i < LEAF_ITERATIONS; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;  /* LCG */
        x ^= x >> 29;
        workload_progress = workload_progress + 1;
        if ((i & PHASE_CHECK_MASK) == PHASE_CHECK_MASK && CURRENT_PHASE() != PHASE_PHYSICS)
            break;
    }
    return x;
}

CHAIN_FN uint64_t physics_compute_forces(uint64_t x)
{
    uint64_t r = physics_leaf(x);
    barrier();
    return r + 1;
}

CHAIN_FN uint64_t physics_step(uint64_t x)
{
    uint64_t r = physics_compute_forces(x);
    barrier();
    return r ^ 0x5555;
}

CHAIN_FN void run_physics(void)
{
    physics_state = physics_step(physics_state);
    barrier();
}

/* ---------------- chain B: render (3 of 11 ticks) ---------------- */

CHAIN_FN uint64_t render_leaf(uint64_t x)
{
    for (unsigned i = 0; i < LEAF_ITERATIONS; i++) {
        x ^= x << 13;                                              /* xorshift */
        x ^= x >> 7;
        x ^= x << 17;
        workload_progress = workload_progress + 1;
        if ((i & PHASE_CHECK_MASK) == PHASE_CHECK_MASK && CURRENT_PHASE() != PHASE_RENDER)
            break;
    }
    return x;
}

CHAIN_FN uint64_t render_rasterize(uint64_t x)
{
    uint64_t r = render_leaf(x);
    barrier();
    return r + 3;
}

CHAIN_FN uint64_t render_draw_scene(uint64_t x)
{
    uint64_t r = render_rasterize(x);
    barrier();
    return r ^ 0x3333;
}

CHAIN_FN uint64_t render_frame(uint64_t x)
{
    uint64_t r = render_draw_scene(x);
    barrier();
    return r + 7;
}

CHAIN_FN void run_render(void)
{
    render_state = render_frame(render_state);
    barrier();
}

/* ---------------- chain C: audio (2 of 11 ticks) ---------------- */

CHAIN_FN uint64_t audio_leaf(uint64_t x)
{
    for (unsigned i = 0; i < LEAF_ITERATIONS; i++) {
        x = (x >> 1) ^ (-(x & 1) & 0xd800000000000000ULL);         /* LFSR */
        x += i;
        workload_progress = workload_progress + 1;
        if ((i & PHASE_CHECK_MASK) == PHASE_CHECK_MASK && CURRENT_PHASE() != PHASE_AUDIO)
            break;
    }
    return x;
}

CHAIN_FN uint64_t audio_mix(uint64_t x)
{
    uint64_t r = audio_leaf(x);
    barrier();
    return r + 5;
}

CHAIN_FN void run_audio(void)
{
    audio_state = audio_mix(audio_state);
    barrier();
}

/* ---------------- idle (1 of 11 ticks) ---------------- */

CHAIN_FN void idle_halt(void)
{
    while (CURRENT_PHASE() == PHASE_IDLE)
        __asm__ volatile("sti; hlt" ::: "memory");
}

CHAIN_FN void run_idle(void)
{
    idle_halt();
    barrier();
}

/* ---------------- dispatcher ---------------- */

CHAIN_FN void workload_loop(void)
{
    while (!workload_stop) {
        enum workload_phase p = CURRENT_PHASE();
        workload_phase = p;
        switch (p) {
        case PHASE_PHYSICS:
            run_physics();
            break;
        case PHASE_RENDER:
            run_render();
            break;
        case PHASE_AUDIO:
            run_audio();
            break;
        case PHASE_IDLE:
            run_idle();
            break;
        }
        barrier();
    }
}
