// The CPU's rate of 512-bit vpdpbusd and vfmadd231ps (12 independent chains each), one thread, then vpdpbusd on
// two threads at once (equal times: the two vCPUs are two cores; doubled: two hyperthreads of one core).
//   gcc -O2 -o vnni vnni_rate.c -lpthread && ./vnni
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <pthread.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
__attribute__((target("avx512f,avx512vnni"))) static double run_vnni(long n){
  __m512i a[12]; __m512i b=_mm512_set1_epi8(1), c=_mm512_set1_epi8(2);
  for(int i=0;i<12;i++) a[i]=_mm512_set1_epi32(i);
  double t=now();
  for(long k=0;k<n;k++){
    #pragma GCC unroll 12
    for(int i=0;i<12;i++) a[i]=_mm512_dpbusd_epi32(a[i],b,c);
    __asm__ volatile("" :: : "memory");
  }
  t=now()-t; int s=0; for(int i=0;i<12;i++) s+=_mm512_reduce_add_epi32(a[i]); if(s==42) puts("x");
  return t;
}
__attribute__((target("avx512f"))) static double run_fma(long n){
  __m512 a[12]; __m512 b=_mm512_set1_ps(1.0001f), c=_mm512_set1_ps(0.999f);
  for(int i=0;i<12;i++) a[i]=_mm512_set1_ps(i);
  double t=now();
  for(long k=0;k<n;k++){
    #pragma GCC unroll 12
    for(int i=0;i<12;i++) a[i]=_mm512_fmadd_ps(a[i],b,c);
    __asm__ volatile("" :: : "memory");
  }
  t=now()-t; float s=0; for(int i=0;i<12;i++) s+=_mm512_reduce_add_ps(a[i]); if(s==42) puts("x");
  return t;
}
long N=200000000/12;
void* th(void* p){ double t=run_vnni(N); *(double*)p=t; return 0;}
int main(){
  double t1=run_vnni(N); printf("vnni 1 thread: %.3f ns per instr -> %.2f per ns\n", t1/(N*12.0)*1e9, N*12.0/t1/1e9);
  double t=run_fma(N); printf("fma  1 thread: %.3f ns per instr -> %.2f per ns\n", t/(N*12.0)*1e9, N*12.0/t/1e9);
  pthread_t a,b; double ta,tb; pthread_create(&a,0,th,&ta); pthread_create(&b,0,th,&tb); pthread_join(a,0); pthread_join(b,0);
  printf("vnni 2 threads: %.3f / %.3f s each (1 thread: %.3f s)\n", ta, tb, t1);
}
